#!/usr/bin/env python3
"""A gRPC client of the standard services, as grpc_health_probe and grpcurl.

  grpc_probe.py --target=HOST:PORT [--tls_dir=DIR --client=admin
                --server_name=coordinator.pstrain] COMMAND

Commands:
  health [--service=S] [--wait_for=STATUS --timeout_s=T]
      grpc.health.v1.Health/Check; prints the status (SERVING,
      NOT_SERVING, ...) or the call's error code. With --wait_for, checks
      every 50 ms until the status is STATUS (exit 0) or T seconds pass
      (exit 1), printing each status seen once, in order.
  list
      grpc.reflection.v1alpha.ServerReflection: prints the server's
      services, one a line.
  describe SYMBOL
      The same reflection service: prints the services of the file that
      defines SYMBOL ("pstrain.ParameterServer"), with their methods.

Without --tls_dir the channel is plaintext. Exit 77 (and a line saying
why) when python3-grpcio is not installed; 1 when a call fails.

Only python3-grpcio and python3-protobuf (Debian 12): the health and
reflection messages are built here from descriptors, since Debian ships
neither grpcio-health-checking nor grpcio-reflection.
"""

import argparse
import sys
import time

try:
    import grpc
    from google.protobuf import descriptor_pb2
    from google.protobuf import descriptor_pool
    from google.protobuf import message_factory
    from google.protobuf import text_format
except ImportError as e:
    print(f"SKIP: python3-grpcio is not installed ({e}); "
          "scripts/setup.sh installs it")
    sys.exit(77)

# grpc/health/v1/health.proto and grpc/reflection/v1alpha/reflection.proto,
# the fields used here (the others are skipped as unknown fields).
_PROTOS = [
    """
name: "grpc/health/v1/health.proto" package: "grpc.health.v1" syntax: "proto3"
message_type {
  name: "HealthCheckRequest"
  field { name: "service" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
}
message_type {
  name: "HealthCheckResponse"
  field { name: "status" number: 1 type: TYPE_ENUM label: LABEL_OPTIONAL
          type_name: ".grpc.health.v1.HealthCheckResponse.ServingStatus" }
  enum_type {
    name: "ServingStatus"
    value { name: "UNKNOWN" number: 0 }
    value { name: "SERVING" number: 1 }
    value { name: "NOT_SERVING" number: 2 }
    value { name: "SERVICE_UNKNOWN" number: 3 }
  }
}
""",
    """
name: "grpc/reflection/v1alpha/reflection.proto"
package: "grpc.reflection.v1alpha" syntax: "proto3"
message_type {
  name: "ServerReflectionRequest"
  field { name: "host" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
  field { name: "file_containing_symbol" number: 4 type: TYPE_STRING
          label: LABEL_OPTIONAL oneof_index: 0 }
  field { name: "list_services" number: 7 type: TYPE_STRING
          label: LABEL_OPTIONAL oneof_index: 0 }
  oneof_decl { name: "message_request" }
}
message_type {
  name: "ServerReflectionResponse"
  field { name: "valid_host" number: 1 type: TYPE_STRING
          label: LABEL_OPTIONAL }
  field { name: "file_descriptor_response" number: 4 type: TYPE_MESSAGE
          label: LABEL_OPTIONAL oneof_index: 0
          type_name: ".grpc.reflection.v1alpha.FileDescriptorResponse" }
  field { name: "list_services_response" number: 6 type: TYPE_MESSAGE
          label: LABEL_OPTIONAL oneof_index: 0
          type_name: ".grpc.reflection.v1alpha.ListServiceResponse" }
  field { name: "error_response" number: 7 type: TYPE_MESSAGE
          label: LABEL_OPTIONAL oneof_index: 0
          type_name: ".grpc.reflection.v1alpha.ErrorResponse" }
  oneof_decl { name: "message_response" }
}
message_type {
  name: "FileDescriptorResponse"
  field { name: "file_descriptor_proto" number: 1 type: TYPE_BYTES
          label: LABEL_REPEATED }
}
message_type {
  name: "ListServiceResponse"
  field { name: "service" number: 1 type: TYPE_MESSAGE label: LABEL_REPEATED
          type_name: ".grpc.reflection.v1alpha.ServiceResponse" }
}
message_type {
  name: "ServiceResponse"
  field { name: "name" number: 1 type: TYPE_STRING label: LABEL_OPTIONAL }
}
message_type {
  name: "ErrorResponse"
  field { name: "error_code" number: 1 type: TYPE_INT32 label: LABEL_OPTIONAL }
  field { name: "error_message" number: 2 type: TYPE_STRING
          label: LABEL_OPTIONAL }
}
""",
]

_HEALTH_CHECK = "/grpc.health.v1.Health/Check"
_REFLECTION = "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo"


def _messages():
    pool = descriptor_pool.DescriptorPool()
    for text in _PROTOS:
        pool.Add(text_format.Parse(text, descriptor_pb2.FileDescriptorProto()))
    factory = message_factory.MessageFactory(pool)

    def message(name):
        desc = pool.FindMessageTypeByName(name)
        if hasattr(message_factory, "GetMessageClass"):
            return message_factory.GetMessageClass(desc)
        return factory.GetPrototype(desc)

    return message


def _channel(args):
    if not args.tls_dir:
        return grpc.insecure_channel(args.target)

    def read(name):
        with open(f"{args.tls_dir}/{name}", "rb") as f:
            return f.read()

    credentials = grpc.ssl_channel_credentials(
        root_certificates=read("ca.pem"),
        private_key=read(f"{args.client}.key"),
        certificate_chain=read(f"{args.client}.pem"))
    return grpc.secure_channel(
        args.target, credentials,
        options=[("grpc.ssl_target_name_override", args.server_name)])


def _health(args, channel, message):
    request_type = message("grpc.health.v1.HealthCheckRequest")
    response_type = message("grpc.health.v1.HealthCheckResponse")
    check = channel.unary_unary(
        _HEALTH_CHECK,
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString)
    status_enum = response_type.DESCRIPTOR.enum_types_by_name["ServingStatus"]
    deadline = time.monotonic() + args.timeout_s
    last = None
    while True:
        try:
            response = check(request_type(service=args.service), timeout=5)
            seen = status_enum.values_by_number[response.status].name
            line = seen
        except grpc.RpcError as e:
            seen = e.code().name
            line = f"{seen}: {e.details()}"
        if seen != last:
            print(line, flush=True)
            last = seen
        if not args.wait_for:
            return 0 if seen in status_enum.values_by_name else 1
        if seen == args.wait_for:
            return 0
        if time.monotonic() > deadline:
            print(f"no {args.wait_for} within {args.timeout_s} s")
            return 1
        time.sleep(0.05)


def _reflect(channel, message, request):
    request_type = message("grpc.reflection.v1alpha.ServerReflectionRequest")
    response_type = message("grpc.reflection.v1alpha.ServerReflectionResponse")
    info = channel.stream_stream(
        _REFLECTION,
        request_serializer=request_type.SerializeToString,
        response_deserializer=response_type.FromString)
    responses = list(info(iter([request_type(**request)]), timeout=10))
    if len(responses) != 1:
        raise RuntimeError(f"{len(responses)} reflection responses, not 1")
    response = responses[0]
    if response.WhichOneof("message_response") == "error_response":
        raise RuntimeError(f"reflection error {response.error_response}")
    return response


def _list(channel, message):
    response = _reflect(channel, message, {"list_services": ""})
    for service in response.list_services_response.service:
        print(service.name)
    return 0


def _describe(channel, message, symbol):
    response = _reflect(channel, message, {"file_containing_symbol": symbol})
    for blob in response.file_descriptor_response.file_descriptor_proto:
        f = descriptor_pb2.FileDescriptorProto.FromString(blob)
        for service in f.service:
            methods = " ".join(m.name for m in service.method)
            print(f"{f.package}.{service.name} ({f.name}): {methods}")
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--tls_dir", default="")
    parser.add_argument("--client", default="admin")
    parser.add_argument("--server_name", default="coordinator.pstrain")
    commands = parser.add_subparsers(dest="command", required=True)
    health = commands.add_parser("health")
    health.add_argument("--service", default="")
    health.add_argument("--wait_for", default="")
    health.add_argument("--timeout_s", type=float, default=30)
    commands.add_parser("list")
    describe = commands.add_parser("describe")
    describe.add_argument("symbol")
    args = parser.parse_args()
    message = _messages()
    with _channel(args) as channel:
        try:
            if args.command == "health":
                return _health(args, channel, message)
            if args.command == "list":
                return _list(channel, message)
            return _describe(channel, message, args.symbol)
        except grpc.RpcError as e:
            print(f"{e.code().name}: {e.details()}")
            return 1


if __name__ == "__main__":
    sys.exit(main())
