#!/bin/sh
# Regenerate the committed pod-resources stubs from podresources.proto.
#
# Needs grpcio-tools (a development tool only: `pip install grpcio-tools`). The proto is compiled
# with the source root as include path, so the stubs import each other as
# `gpu_exporter.allocation.proto.podresources_pb2` (no sys.path tricks). The generated code pins
# the protobuf runtime it needs (ValidateProtobufRuntimeVersion): keep pyproject's protobuf floor
# at the version printed in podresources_pb2.py. No gRPC service stubs: the calls are made and
# served by gpu_exporter/allocation/grpcwire.py, without gRPC's runtime.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
python=${PYTHON:-python3}
case "$python" in
*/*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;;  # relative to here
esac
cd "$src"
"$python" -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. \
    gpu_exporter/allocation/proto/podresources.proto
