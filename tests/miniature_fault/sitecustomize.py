"""Put this folder on PYTHONPATH: an engine-path failure that only the miniature reaches, while the real load runs.

Python imports ``sitecustomize`` at the start of every process, vLLM's engine processes included. Each process
learns its side from its command line (the miniature's extract reads a model from an ``eaglewatch-miniature-*``
folder) or, in the engine processes either side spawns, from its parent's environment:
- the miniature's side switches on the connector's fault injection (``EAGLEWATCH_INJECT_FAULT``): its first write
  asserts, as a real engine-path bug would;
- the job's side holds vLLM's weight loading until its process is stopped: the real load is still running when the
  miniature fails, as an 18-minute load would be.
"""

import importlib.abc
import importlib.machinery
import os
import sys
import threading

SIDE = "EAGLEWATCH_TEST_SIDE"
LOADER = "vllm.model_executor.model_loader.default_loader"

_argv = " ".join(sys.argv)
if "eaglewatch-miniature-" in _argv:
    os.environ[SIDE] = "miniature"
    os.environ["EAGLEWATCH_INJECT_FAULT"] = "worker_assert:0"
elif "extract" in sys.argv:
    os.environ[SIDE] = "job"


class _HoldTheLoad(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Wraps vLLM's default loader, once imported, so that loading weights never ends."""

    def find_spec(self, name, path, target=None):
        if name != LOADER:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None:
            return None
        self._inner = spec.loader
        spec.loader = self
        return spec

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module):
        self._inner.exec_module(module)

        def load_weights(loader, model, model_config):
            print("[test] the real load holds here until its process is stopped", flush=True)
            threading.Event().wait()

        module.DefaultModelLoader.load_weights = load_weights


if os.environ.get(SIDE) == "job":
    sys.meta_path.insert(0, _HoldTheLoad())
