#!/bin/sh
# Regenerate the committed pod-resources stubs from podresources.proto.
#
# Needs grpcio-tools (a development tool only: `pip install grpcio-tools`). The proto is compiled
# with the source root as include path, so the stubs import each other as
# `gpu_exporter.allocation.proto.podresources_pb2` (no sys.path tricks). The generated code pins
# the protobuf runtime it needs (ValidateProtobufRuntimeVersion): keep pyproject's protobuf floor
# at the version printed in podresources_pb2.py. The service stubs (podresources_grpc.py) are
# grpclib's, by its protoc plugin (installed with grpclib, beside the interpreter): the simulator's
# kubelet serves the generated base class; the exporter's client makes its calls through
# gpu_exporter/allocation/channel.py.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
src=$(cd "$here/../../.." && pwd)
python=${PYTHON:-python3}
case "$python" in
*/*) python="$(cd "$(dirname "$python")" && pwd)/$(basename "$python")" ;;  # relative to here
esac
plugin="$(dirname "$python")/protoc-gen-grpclib_python"
[ -x "$plugin" ] || plugin=$(command -v protoc-gen-grpclib_python)
cd "$src"
"$python" -m grpc_tools.protoc -I . \
    --python_out=. --pyi_out=. --grpclib_python_out=. \
    --plugin=protoc-gen-grpclib_python="$plugin" \
    gpu_exporter/allocation/proto/podresources.proto
