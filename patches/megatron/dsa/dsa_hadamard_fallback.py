"""Megatron's DeepSeek sparse attention (DSA) runs without ``fast_hadamard_transform`` (megatron-core 0.16-0.19).

Declaration module. ``experimental_attention_variant/dsa.py`` appeared in megatron-core 0.16.0 and
from 0.16.0 to 0.19.x binds ``hadamard_transform`` the same way: ``from fast_hadamard_transform import
hadamard_transform`` in a ``try``, ``None`` on ``ImportError``; the DSA indexer's ``rotate_activation``
asserts the binding is not None ("fast_hadamard_transform is not installed.") and calls it with
``scale=hidden_size**-0.5``. The package builds only with nvcc: on ROCm it cannot be installed, on
CPU it is absent, and every DSA forward fails there. verl installs a pure-torch transform
(``verl/models/mcore/patch.py``: ``apply_fast_hadamard_transform_shim``).

The patch wraps the module's binding (``._dsa_hadamard_fallback:fallback_when_missing``): ``None``
becomes a pure-torch Fast Walsh-Hadamard transform with the package's signature, limits and results
(float32 arithmetic, zero padding of a last dimension that is not a power of two); a real function,
bound because the package imported, is handed back as it is, so with the package installed the
patch changes nothing. ``rotate_activation`` looks the name up in the module at each call, so the
binding serves every DSA forward whether ``dsa`` was imported before or after the patch applied.
Megatron-core 0.14 and 0.15 have no DSA module and no variant: the patch is skipped there.

Why the binding and not ``sys.modules``: verl also registers a stub ``fast_hadamard_transform``
module, so that any later importer finds the name. patchkit does not: a process-wide fake package
answers every importer and every availability probe, not only Megatron's (ModelOpt's rotation
quantizer imports the package; transformers' ``is_fast_hadamard_available`` calls
``importlib.util.find_spec``, which raises ``ValueError`` for a module whose ``__spec__`` is None), it
would change other upstreams than the one this patch declares, and it cannot be taken back from the
modules that imported it. Megatron-core binds the name in ``dsa.py`` alone (0.16-0.19), so filling
that binding covers DSA completely and reverts cleanly.
"""

from __future__ import annotations

from patchkit import Patch, Variant, Wrap

from .._constants import DSA, MEGATRON_CORE

PATCHES = (
    Patch(
        id="megatron.dsa_hadamard_fallback",
        self_check="._checks.dsa_hadamard_fallback:check_dsa_hadamard_fallback",
        summary=(
            "Megatron's DSA indexer (rotate_activation) gets a pure-torch Hadamard transform when the "
            "CUDA-only fast_hadamard_transform package is not importable; the real one is kept when it is."
        ),
        why=(
            "dsa.py binds hadamard_transform to None when fast_hadamard_transform fails to import, and "
            "rotate_activation asserts it is not None: the package builds only with nvcc, so every DSA "
            "forward fails on ROCm and CPU. verl installs a pure-torch transform for this."
        ),
        upstream=(
            "https://github.com/NVIDIA/Megatron-LM/blob/core_v0.19.0/megatron/core/transformer/"
            "experimental_attention_variant/dsa.py (rotate_activation); "
            "https://github.com/Dao-AILab/fast-hadamard-transform (hadamard_transform)"
        ),
        removal=(
            "Remove once dsa.py has a fallback of its own for a missing fast_hadamard_transform "
            "(0.16.0-0.19.x assert it is installed) or the package ships builds for ROCm and CPU."
        ),
        version_modules=MEGATRON_CORE,
        variants=(
            Variant(
                label="fill-missing-binding",
                requires={"megatron-core": ">=0.16,<0.20"},
                installs=(Wrap(f"{DSA}:hadamard_transform", "._dsa_hadamard_fallback:fallback_when_missing"),),
            ),
        ),
    ),
)
