"""The gRPC tests' affine inputs (test_grpc*.py): X and IDX, two rows, as tritonclient.grpc
InferInputs."""
import numpy as np
import tritonclient.grpc as grpcclient

X = np.arange(16, dtype=np.float32).reshape(2, 8) / 10
IDX = np.arange(6, dtype=np.int64).reshape(2, 3)


def affine_inputs(x=X, idx=IDX):
    a = grpcclient.InferInput("x", list(x.shape), "FP32")
    a.set_data_from_numpy(x)
    b = grpcclient.InferInput("idx", list(idx.shape), "INT64")
    b.set_data_from_numpy(idx)
    return [a, b]
