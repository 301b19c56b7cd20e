// `pstrain eval`: the test loss and accuracy of a saved model on the
// test set of --dataset/--data_dir, on --backend (the model, its input
// shape and classes come from the file's metadata; a checkpoint's model file
// is read against its manifest).
//
// Thread-safety: call from main() only (reads the flags).
#ifndef PSTRAIN_CLI_EVAL_COMMAND_H_
#define PSTRAIN_CLI_EVAL_COMMAND_H_

#include <string>

namespace pstrain {

// `checkpoint`: a model file, a job's checkpoint folder (its final
// model.safetensors, else the checkpoint its `latest` names) or one
// step-<N> folder of it. `batch_size`: test images evaluated at once (1 to
// 65536). Prints one line of results; returns the exit code: 0, 2 for bad
// flags or files (a one-line error naming them), 1 if evaluation failed.
int EvalCommand(const std::string& checkpoint, int batch_size);

}  // namespace pstrain

#endif  // PSTRAIN_CLI_EVAL_COMMAND_H_
