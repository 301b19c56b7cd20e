#include "models/cpu_inner_product.h"

#include <utility>

#include "absl/synchronization/mutex.h"
#include "models/cpu_dnnl.h"

namespace pstrain {

using cpu_dnnl::Converted;
using cpu_dnnl::CopyIf;
using cpu_dnnl::CpuEngine;
using cpu_dnnl::CpuStream;
using cpu_dnnl::CreationMutex;
using cpu_dnnl::Run;
using cpu_dnnl::WithType;
using cpu_dnnl::Wrap;
using dnnl::memory;
using tag = dnnl::memory::format_tag;
using dt = dnnl::memory::data_type;

InnerProductOp::InnerProductOp(std::string name, int64_t in, int64_t out,
                               bool bf16)
    : name_(std::move(name)), in_(in), out_(out), bf16_(bf16) {}

absl::Status InnerProductOp::Forward(const float* x, int64_t rows,
                                     const float* w, const float* b, float* y) {
  return Run(name_, [&] {
    Prepare(rows);
    fwd_.execute(CpuStream(),
                 {{DNNL_ARG_SRC, Converted(Wrap(src_md_, x), src_c_)},
                  {DNNL_ARG_WEIGHTS, Converted(Wrap(wei_md_, w), wei_c_)},
                  {DNNL_ARG_BIAS, Wrap(bias_md_, b)},
                  {DNNL_ARG_DST, Wrap(dst_md_, y)}});
  });
}

absl::Status InnerProductOp::Backward(const float* x, int64_t rows,
                                      const float* w, const float* dy,
                                      float* dx, float* dw, float* db) {
  return Run(name_, [&] {
    Prepare(rows);
    const memory dy_c = Converted(Wrap(dst_md_, dy), dout_c_);
    bwd_weights_.execute(CpuStream(),
                         {{DNNL_ARG_SRC, Converted(Wrap(src_md_, x), src_c_)},
                          {DNNL_ARG_DIFF_DST, dy_c},
                          {DNNL_ARG_DIFF_WEIGHTS, Wrap(wei_md_, dw)},
                          {DNNL_ARG_DIFF_BIAS, Wrap(bias_md_, db)}});
    if (dx != nullptr) {
      bwd_data_.execute(
          CpuStream(), {{DNNL_ARG_DIFF_DST, dy_c},
                        {DNNL_ARG_WEIGHTS, Converted(Wrap(wei_md_, w), wei_c_)},
                        {DNNL_ARG_DIFF_SRC, Wrap(src_md_, dx)}});
    }
  });
}

void InnerProductOp::Prepare(int64_t rows) {
  if (rows == rows_) return;
  absl::MutexLock lock(&CreationMutex());
  rows_ = rows;
  const dt compute = bf16_ ? dt::bf16 : dt::f32;
  src_md_ = memory::desc({rows, in_}, dt::f32, tag::nc);
  wei_md_ = memory::desc({out_, in_}, dt::f32, tag::oi);
  bias_md_ = memory::desc({out_}, dt::f32, tag::x);
  dst_md_ = memory::desc({rows, out_}, dt::f32, tag::nc);
  const memory::desc src_c = WithType(src_md_, compute);
  const memory::desc wei_c = WithType(wei_md_, compute);
  const memory::desc dst_c = WithType(dst_md_, compute);
  src_c_ = CopyIf(bf16_, src_c);
  wei_c_ = CopyIf(bf16_, wei_c);
  dout_c_ = CopyIf(bf16_, dst_c);
  dnnl::inner_product_forward::primitive_desc fwd_pd(
      dnnl::inner_product_forward::desc(dnnl::prop_kind::forward_training,
                                        src_c, wei_c, bias_md_, dst_md_),
      CpuEngine());
  fwd_ = dnnl::inner_product_forward(fwd_pd);
  bwd_data_ = dnnl::inner_product_backward_data(
      dnnl::inner_product_backward_data::primitive_desc(
          dnnl::inner_product_backward_data::desc(src_md_, wei_c, dst_c),
          CpuEngine(), fwd_pd));
  bwd_weights_ = dnnl::inner_product_backward_weights(
      dnnl::inner_product_backward_weights::primitive_desc(
          dnnl::inner_product_backward_weights::desc(src_c, wei_md_, bias_md_,
                                                     dst_c),
          CpuEngine(), fwd_pd));
}

}  // namespace pstrain
