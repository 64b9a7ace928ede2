"""tokenmix: causal token mixers as (A, B) pairs, Y = (I - B)^-1 A X.

Levels of interface:
    core      -- MixOperator (A, B, optional readout R) and the one dense reference solver
    patterns  -- sparsity patterns N(i) of the recurrent part B
    ops       -- fast kernels (chunked sparse triangular solve, chunkwise scans)
    mixers    -- one mixer per file, registered by name
    models    -- the one generic model (embedding -> blocks -> head)
Above them: runs (the on-disk record of a run), training / analysis / bench / hf, study (the paper,
the comparison and every preset), cli (parsing only). Each floor imports only the floors below it.

Hugging Face registration (the one import this file makes of a floor above it, by design). After
``import tokenmix``, ``AutoModelForCausalLM.from_pretrained(folder)`` of an exported model works:
``tokenmix.hf`` registers the classes with transformers' auto classes when it is imported. Importing
it here would load torch and transformers (seconds) on every ``import tokenmix``, which the command
line makes on every call and which must happen before torch loads (cli/main.py sets
OMP_WAIT_POLICY first). So:
  * transformers already imported: import ``tokenmix.hf`` now;
  * transformers installed but not imported: a ``sys.meta_path`` finder watches the imports of
    ``transformers`` modules; once the outermost one has finished and ``transformers.models.auto``
    is loaded, it imports ``tokenmix.hf`` and removes itself. Not right after
    ``transformers.models.auto`` itself executes: ``from transformers import PreTrainedModel``
    loads it half-way through ``modeling_utils``, whose classes ``tokenmix.hf`` needs complete;
  * transformers not installed: nothing.
The finder only wraps the loaders of ``transformers`` modules (a counter around ``exec_module``) and
gives each module its own loader back once executed. A failure to register is a warning, never an
error in the user's import of transformers.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys

__version__ = "0.1.0"


class _CountingLoader:
    """Runs a ``transformers`` module's own loader, counting how deep such executions are nested."""

    def __init__(self, loader, hook: "_RegisterAfterTransformers") -> None:
        self.loader, self.hook = loader, hook

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module) -> None:
        module.__spec__.loader = module.__loader__ = self.loader  # the module keeps its real loader
        self.hook.depth += 1
        try:
            self.loader.exec_module(module)
        finally:
            self.hook.depth -= 1
        if self.hook.depth == 0 and "transformers.models.auto" in sys.modules:
            self.hook.register()


class _RegisterAfterTransformers:
    """``sys.meta_path`` finder: hands out the normal spec of each ``transformers`` module with a
    ``_CountingLoader``; registers tokenmix once an outermost import leaves the auto classes loaded."""

    def __init__(self) -> None:
        self.depth = 0

    def find_spec(self, name, path=None, target=None):
        if name != "transformers" and not name.startswith("transformers."):
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(name, path, target)
            if spec is not None:
                if spec.loader is not None and hasattr(spec.loader, "exec_module"):
                    spec.loader = _CountingLoader(spec.loader, self)
                return spec
        return None

    def register(self) -> None:
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        _import_hf()


def _import_hf() -> None:
    try:
        importlib.import_module("tokenmix.hf")
    except Exception as e:  # a transformers this code does not fit: the user's own import goes on
        import warnings

        warnings.warn(
            f"tokenmix: could not register its models with transformers ({type(e).__name__}: {e})", stacklevel=2
        )


if "transformers" in sys.modules:
    _import_hf()
elif importlib.util.find_spec("transformers") is not None:
    sys.meta_path.insert(0, _RegisterAfterTransformers())
