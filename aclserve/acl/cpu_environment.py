"""The environment variables the CPU runtime reads (acl/cpu/settings.py, faults.py say what each
does), named where they are light to import: the acl.cpu package imports onnx and Pillow, ~0.5 s
that `aclserve infer` and `compile`, which warn of an ACLSERVE_* variable none reads
(cli/environment.py), do not otherwise spend."""

CPU_RUNTIME_ENV = ("ACLSERVE_CPU_DEVICES", "ACLSERVE_CPU_DEVICE_MEMORY", "ACLSERVE_CPU_THREADS",
                   "ACLSERVE_CPU_MAX_STREAMS", "ACLSERVE_CPU_MAX_EVENTS", "ACLSERVE_CPU_SOC", "ACLSERVE_CPU_RUN_MODE",
                   "ACLSERVE_CPU_LACKS", "ACLSERVE_CPU_FAULTS", "ACLSERVE_CPU_CHECK_HOST")
