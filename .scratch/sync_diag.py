"""Print the Python stack of every CUDA-synchronizing call made while building a THD layout."""
import sys, traceback, warnings
import torch
sys.path.insert(0, "tests/megatron")
from patchkit.patches.megatron import router_replay_api as replay

def show(message, category, filename, lineno, file=None, line=None):
    if "synchroniz" in str(message):
        print("SYNC:", message)
        print("".join(l for l in traceback.format_stack()[:-1] if "_router_replay" in l or "torch" in l.split(",")[0][-40:]))

warnings.showwarning = show
cuda = torch.device("cuda")
for tp, cp, fp8 in [(1, 1, True), (2, 1, False), (4, 2, True)]:
    g = torch.Generator().manual_seed(tp + cp)
    lengths = torch.randint(1, 300, (16,), generator=g)
    mask = (torch.arange(320) < lengths.unsqueeze(1)).to(cuda)
    torch.cuda.synchronize()
    print(f"==== tp={tp} cp={cp} fp8={fp8}")
    warnings.simplefilter("always")
    torch.cuda.set_sync_debug_mode("warn")
    replay.thd_layout(mask, tp_size=tp, cp_size=cp, fp8_padding=fp8)
    torch.cuda.set_sync_debug_mode(0)
