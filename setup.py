import re
from pathlib import Path

from setuptools import find_packages, setup

# the one place the version is written; read as text so building never imports the package
VERSION = re.search(r'^__version__ = "([^"]+)"$', (Path(__file__).parent / "aclserve" / "_version.py").read_text(),
                    re.M).group(1)

setup(
    name="aclserve",
    version=VERSION,
    description="KServe v2 inference server for Huawei Ascend .om models (pyACL), with a CPU runtime",
    packages=find_packages(include=["aclserve", "aclserve.*"]),
    package_data={"aclserve": ["configs/*.yaml"]},
    python_requires=">=3.10",
    install_requires=[
        "numpy>=1.24",
        "pillow>=10",
        "onnx>=1.15",
        # 1.25 on: an integer division by zero fails the run where older releases end the process
        # with SIGFPE (acl/cpu/_safe_division.py); Python 3.10's newest wheel is 1.23.2
        "onnxruntime>=1.25; python_version >= '3.11'",
        "onnxruntime>=1.17; python_version < '3.11'",
        "aiohttp>=3.9",
        "orjson>=3.11.6",  # loads() depth limit (3.9.15) and dumps() recursion fix (3.11.6); tested 3.11.6, 3.13.0
        # larger JSON bodies: tensor data read in C (server/json_simd.py); tested 7.0.2, which has no
        # Python 3.14 wheel: pip builds it there from its source (a C++ compiler, Python's headers)
        "pysimdjson>=7.0",
        "pyyaml>=6",
        "watchdog>=4",
        "prometheus-client>=0.19",
        "uvloop>=0.19; sys_platform != 'win32'",
        # the gRPC endpoint: grpc.aio, and the KServe v2 / Triton message classes generated
        # from grpc_service.proto that tritonclient[grpc] ships (no generated code in this repo)
        "grpcio>=1.60",
        "tritonclient[grpc]>=2.50",
    ],
    extras_require={
        # kubernetes + kserve: their models are the published schemas tests/test_deploy.py checks
        # deploy/ against (kubernetes 37 needs pydantic>=2.13.5; <37 leaves pydantic alone); every
        # kserve from 0.14 declares Python < 3.14, so these extras install on 3.11 to 3.13 only (a
        # marker leaving kserve out on 3.14 would trade the install's refusal for failing tests)
        # matplotlib: `aclserve profile --png` and the benchmarks' charts (tested: 3.11.2)
        # pytest-asyncio 0.24 reads pytest.ini's asyncio_default_fixture_loop_scope; pytest-timeout
        # is the per-test hang guard pytest.ini sets; import-linter: tests/test_layers.py checks
        # the import contracts of .importlinter (tested: 2.17); trustme: a test certificate
        # authority for the TLS tests (python-trio's; tested: 1.2.1); pytest-xdist: the README's
        # `-n 2` runs the suite on both cores of a 2-core machine (1.7 times as fast as one process on
        # 2026-12-06: 8 min where one took 14; the README's "The test suite" gives today's time; tested: 3.8);
        # hpack: the HPACK header blocks of the gRPC tests' raw HTTP/2 frames, written and read (python-hyper's,
        # pure Python; tests/server/test_grpc_metadata.py; tested: 4.2.0)
        "test": ["pytest>=8", "pytest-aiohttp>=1.0", "pytest-asyncio>=0.24", "pytest-timeout>=2.1", "pytest-xdist>=3.5",
                 "tritonclient[http,grpc]>=2.50", "hypothesis>=6", "kubernetes>=30,<37", "kserve>=0.14",
                 "matplotlib>=3.7", "import-linter>=2.17", "trustme>=1.1", "hpack>=4"],
        "tools": ["scikit-learn>=1.3", "matplotlib>=3.7"],
        "plot": ["matplotlib>=3.7"],
    },
    entry_points={"console_scripts": ["aclserve=aclserve.cli:main"]},
)
