"""Injected by ``prism-debug run`` (this folder is put first on PYTHONPATH).

It makes every Python process the run starts — the script and whatever the
script spawns — load the prism-debug agent as soon as it imports torch, and
costs nothing in processes that never do.  Only the first of them (the rank's own
process) links to the debugger bus; the others load the agent without a link (see
``agent.config.claim_bus``), so no subprocess can speak for the rank.  Python
imports only the first ``sitecustomize`` on the path, so this one then runs the
one it shadows.
"""

import os
import sys


def _install_torch_import_hook():
    import importlib.abc

    class _AfterTorchImport(importlib.abc.MetaPathFinder):
        """Wraps the loader of the module ``torch`` so that the agent loads right
        after torch does.  It stays in place until torch is really imported:
        a mere lookup (``importlib.util.find_spec("torch")``, as libraries do
        to test for torch) must not use it up."""

        def find_spec(self, name, path=None, target=None):
            if name != "torch":
                return None
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(name, path, target)
                if spec is not None:
                    break
            loader = getattr(spec, "loader", None)
            if loader is None or not hasattr(loader, "exec_module"):
                return spec  # torch absent, or a loader we cannot wrap: leave it be
            exec_module = loader.exec_module
            finder = self

            def exec_then_bootstrap(module):
                exec_module(module)
                if finder in sys.meta_path:
                    sys.meta_path.remove(finder)
                from prism_debug.agent.agent import bootstrap

                bootstrap()

            loader.exec_module = exec_then_bootstrap
            return spec

    sys.meta_path.insert(0, _AfterTorchImport())


def _run_shadowed_sitecustomize():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    path = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", path)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


if os.environ.get("PRISM_DEBUG_CONFIG"):
    if "torch" in sys.modules:  # imported already (an interpreter that preloads it)
        from prism_debug.agent.agent import bootstrap

        bootstrap()
    else:
        _install_torch_import_hook()
_run_shadowed_sitecustomize()
