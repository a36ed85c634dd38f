"""``patchkit doctor``: prove the patches on the stack installed here (see :mod:`.runner`)."""

from .runner import FAILED, NEEDS_GPU, NOT_APPLICABLE, VERIFIED, Verdict, examine, exit_status, run

__all__ = ["FAILED", "NEEDS_GPU", "NOT_APPLICABLE", "VERIFIED", "Verdict", "examine", "exit_status", "run"]
