"""The expert naming the QAT family's expert patches share: ModelOpt's ``SequentialMLP`` local experts.

ModelOpt's quantizable MoE names each expert's linears ``...mlp.experts.local_experts.<i>.<linear>``
(``<i>`` local to the expert-parallel rank); Bridge's own grouped-GEMM naming is
``...mlp.experts.linear_fc1.weight<i>``.
"""

from __future__ import annotations

import re

#: ``...mlp.experts.local_experts.<i>.``: group 1 is the local expert number.
LOCAL_EXPERT = re.compile(r"\.mlp\.experts\.local_experts\.(\d+)\.")
