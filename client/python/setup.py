"""Builds the attnserve package, generating its gRPC stubs from the repository's proto/ folder.

The .proto files are the one API contract (proto/attnserve/v1/*.proto); this build step runs
grpcio-tools' protoc on them into the build tree, so the wheel always matches the checkout it is
built from. ATTNSERVE_PROTO_DIR overrides where the protos are (default: ../../proto).
"""
import os
import pathlib

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = pathlib.Path(__file__).resolve().parent
PROTOS = ["attnserve/v1/encoder.proto", "attnserve/v1/trainer.proto"]


def proto_dir() -> pathlib.Path:
    candidates = [os.environ.get("ATTNSERVE_PROTO_DIR"), HERE.parent.parent / "proto",
                  HERE / "proto"]
    for candidate in candidates:
        if candidate and (pathlib.Path(candidate) / PROTOS[0]).is_file():
            return pathlib.Path(candidate)
    raise RuntimeError(
        f"attnserve's .proto files are not found (looked for {PROTOS[0]} under "
        f"{', '.join(str(c) for c in candidates if c)}): build from a checkout of the "
        "repository (pip install ./client/python) or set ATTNSERVE_PROTO_DIR")


class BuildPyWithStubs(build_py):
    def run(self) -> None:
        super().run()
        from grpc_tools import protoc
        import grpc_tools

        out = pathlib.Path(self.build_lib)
        (out / "attnserve" / "v1").mkdir(parents=True, exist_ok=True)
        includes = [str(proto_dir()),
                    str(pathlib.Path(grpc_tools.__file__).parent / "_proto")]
        for proto in PROTOS:
            args = ["grpc_tools.protoc", *(f"-I{i}" for i in includes),
                    f"--python_out={out}", f"--pyi_out={out}", f"--grpc_python_out={out}", proto]
            if protoc.main(args) != 0:
                raise RuntimeError(f"protoc failed on {proto}")


setup(cmdclass={"build_py": BuildPyWithStubs})
