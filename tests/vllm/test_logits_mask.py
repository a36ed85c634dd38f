"""``patchkit.patches.vllm.logits``: a loaded vLLM model's logits masked at out-of-vocabulary and banned ids.

Upstream truth: vLLM's own ``LlamaForCausalLM`` (tiny config, built on CPU as vLLM's loader builds it,
weights processed by vLLM's ``process_weights_after_loading``; on 0.29 the harness's
``cpu_activation_op`` lets its MLP be built, and no MLP runs), its ``compute_logits`` called before the
mask is set. Masked, its logits equal upstream's everywhere but the masked ids, which are ``-inf``, in
a tensor of the same shape, dtype and device; greedy and random sampling never pick a masked id even
when the model's weights favour it; ``unmask_logits`` gives the model its own method back; bad input
is refused with ``LogitsMaskError`` and the model stays as it was.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch
import vllm_cpu_harness
from patchkit.patches.vllm.logits import LogitsMask, LogitsMaskError, logits_mask, mask_logits, unmask_logits

#: The tiny Llama's logits are 256 wide (``vllm_cpu_harness.TINY_LLAMA_CONFIG``); the tokenizer it
#: stands for has 200 tokens, so ids 200..255 are the padded tail.
WIDTH = 256
VOCAB = 200
BANNED = (3, 17, 150)
MASKED = sorted({*BANNED, *range(VOCAB, WIDTH)})
KEPT = sorted(set(range(WIDTH)) - set(MASKED))


@pytest.fixture(scope="module")
def model(vllm_config: Any) -> Any:
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.model_loader.utils import process_weights_after_loading
    from vllm.model_executor.models.llama import LlamaForCausalLM

    with set_current_vllm_config(vllm_config), torch.device("cpu"), vllm_cpu_harness.cpu_activation_op():
        model = LlamaForCausalLM(vllm_config=vllm_config)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.copy_(torch.randn(parameter.shape, generator=generator) * 0.05)
    process_weights_after_loading(model, vllm_config.model_config, torch.device("cpu"))
    return model


@pytest.fixture
def unmasked(model: Any) -> Iterator[Any]:
    """The model, its mask (if a test set one) removed after the test."""
    yield model
    unmask_logits(model)


def hidden_states(rows: int = 5) -> torch.Tensor:
    return torch.randn(rows, 128, generator=torch.Generator().manual_seed(1))


def test_masked_logits_equal_upstream_but_at_the_masked_ids(unmasked):
    hidden = hidden_states()
    upstream = unmasked.compute_logits(hidden)
    assert upstream.shape == (5, WIDTH)

    mask = mask_logits(unmasked, VOCAB, banned_token_ids=[150, 3, 17, 3])
    masked = unmasked.compute_logits(hidden)

    assert mask == LogitsMask(VOCAB, BANNED)
    assert (masked.shape, masked.dtype, masked.device) == (upstream.shape, upstream.dtype, upstream.device)
    assert torch.equal(masked[:, KEPT], upstream[:, KEPT])
    assert torch.isneginf(masked[:, MASKED]).all()
    assert torch.isfinite(upstream[:, MASKED]).all()
    # The mask writes into the logits vLLM returns: the model keeps none of them, so its next call
    # (through its own method) still scores the masked ids.
    assert torch.equal(type(unmasked).compute_logits(unmasked, hidden), upstream)


def test_arguments_reach_the_model_s_method_unchanged(unmasked):
    hidden = hidden_states()
    upstream = unmasked.compute_logits(hidden)
    mask_logits(unmasked, VOCAB)

    masked = unmasked.compute_logits(hidden_states=hidden)

    assert torch.equal(masked[:, :VOCAB], upstream[:, :VOCAB])
    assert torch.isneginf(masked[:, VOCAB:]).all()
    assert torch.equal(hidden, hidden_states())


def test_sampling_never_picks_a_masked_id_even_when_the_weights_favour_it(unmasked):
    head = unmasked.lm_head.weight
    saved = head.detach().clone()
    hidden = torch.zeros(4, 128)
    hidden[:, 0] = 1.0
    with torch.no_grad():  # the tail id and a banned id score highest, id 42 next
        head.zero_()
        head[230, 0], head[3, 0], head[42, 0], head[7, 0] = 10.0, 9.0, 1.0, 0.5
    try:
        assert unmasked.compute_logits(hidden).argmax(dim=-1).tolist() == [230] * 4

        mask_logits(unmasked, VOCAB, banned_token_ids=BANNED)
        logits = unmasked.compute_logits(hidden)
        probabilities = torch.softmax(logits, dim=-1)
        draws = torch.multinomial(probabilities, 2000, replacement=True,
                                  generator=torch.Generator().manual_seed(2))
    finally:
        with torch.no_grad():
            head.copy_(saved)

    assert logits.argmax(dim=-1).tolist() == [42] * 4
    assert (probabilities[:, MASKED] == 0).all()
    assert not torch.isin(draws, torch.tensor(MASKED)).any()


def test_unmask_gives_the_model_its_own_method_back(unmasked):
    hidden = hidden_states()
    upstream = unmasked.compute_logits(hidden)
    mask = mask_logits(unmasked, VOCAB, BANNED)

    assert logits_mask(unmasked) == mask
    assert unmask_logits(unmasked) == mask
    assert "compute_logits" not in vars(unmasked)
    assert unmasked.compute_logits.__func__ is type(unmasked).compute_logits
    assert torch.equal(unmasked.compute_logits(hidden), upstream)
    assert logits_mask(unmasked) is None
    assert unmask_logits(unmasked) is None


def test_unmask_puts_back_a_method_the_instance_had_of_its_own(unmasked):
    own = unmasked.compute_logits  # e.g. another library's wrapper set on the instance
    unmasked.compute_logits = lambda hidden: own(hidden) * 2
    try:
        installed_before = vars(unmasked)["compute_logits"]
        mask_logits(unmasked, VOCAB)
        masked = unmasked.compute_logits(hidden_states())
        unmask_logits(unmasked)
        assert vars(unmasked)["compute_logits"] is installed_before
    finally:
        del unmasked.compute_logits
    assert torch.equal(masked[:, :VOCAB], 2 * own(hidden_states())[:, :VOCAB])
    assert torch.isneginf(masked[:, VOCAB:]).all()


def test_the_same_mask_again_changes_nothing_and_a_different_one_is_refused(unmasked):
    mask = mask_logits(unmasked, VOCAB, BANNED)
    method = vars(unmasked)["compute_logits"]

    assert mask_logits(unmasked, VOCAB, reversed(BANNED)) == mask
    with pytest.raises(LogitsMaskError, match="already masked"):
        mask_logits(unmasked, VOCAB, (3,))
    with pytest.raises(LogitsMaskError, match="already masked"):
        mask_logits(unmasked, VOCAB + 1, BANNED)

    assert vars(unmasked)["compute_logits"] is method
    assert torch.isneginf(unmasked.compute_logits(hidden_states())[:, MASKED]).all()


@pytest.mark.parametrize(("vocab_size", "banned", "message"), [
    (0, (), "must be positive"),
    (-5, (), "must be positive"),
    (WIDTH + 1, (), "larger than the model's logits width 256"),
    (200.0, (), "must be an int"),
    (True, (), "must be an int"),
    ("200", (), "must be an int"),
    (VOCAB, (WIDTH,), "banned token id 256 is outside the model's logits width 256"),
    (VOCAB, (-1,), "must not be negative"),
    (VOCAB, (1.5,), "must be an int"),
    (VOCAB, (True,), "must be an int"),
    (VOCAB, "12", "must be ints"),
    (VOCAB, 12, "must be ints"),
    (VOCAB, (None,), "must be an int"),
])
def test_bad_input_is_refused_and_the_model_stays_as_it_was(unmasked, vocab_size, banned, message):
    with pytest.raises(LogitsMaskError, match=message):
        mask_logits(unmasked, vocab_size, banned)

    assert logits_mask(unmasked) is None
    assert "compute_logits" not in vars(unmasked)


def test_the_whole_vocabulary_and_integer_tensors_are_taken(unmasked):
    hidden = hidden_states()
    upstream = unmasked.compute_logits(hidden)

    mask_logits(unmasked, torch.tensor(WIDTH), torch.tensor([5, 6]))

    masked = unmasked.compute_logits(hidden)
    kept = sorted(set(range(WIDTH)) - {5, 6})
    assert torch.equal(masked[:, kept], upstream[:, kept])
    assert torch.isneginf(masked[:, [5, 6]]).all()


def test_a_model_without_compute_logits_is_refused():
    with pytest.raises(LogitsMaskError, match="has no compute_logits"):
        mask_logits(torch.nn.Linear(2, 2), VOCAB)


class _Delegate:
    """A wrapper whose width cannot be read ahead (as vLLM's CUDA graph wrapper forwards attributes)."""

    def __init__(self, model: Any) -> None:
        self.model = model

    def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.model.compute_logits(hidden)


def test_a_mask_wider_than_logits_read_only_at_call_time_is_refused_there(unmasked):
    wrapper = _Delegate(unmasked)
    mask_logits(wrapper, WIDTH + 10)

    with pytest.raises(LogitsMaskError, match="larger than the model's logits width 256"):
        wrapper.compute_logits(hidden_states())
    assert unmask_logits(wrapper) == LogitsMask(WIDTH + 10)


def test_logits_narrower_than_a_width_already_checked_are_refused_at_that_call():
    """The width is checked once, and again whenever a call returns another width."""

    class Logits:
        width = WIDTH

        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            return torch.zeros(hidden.shape[0], self.width)

    model = Logits()
    mask_logits(model, VOCAB)
    assert model.compute_logits(hidden_states()).shape[-1] == WIDTH
    model.width = VOCAB - 1
    with pytest.raises(LogitsMaskError, match=f"larger than the model's logits width {VOCAB - 1}"):
        model.compute_logits(hidden_states())


def test_logits_that_are_the_caller_s_tensor_are_copied_before_masking(vllm_config):
    from vllm.model_executor.layers.logits_processor import LogitsProcessor

    class LogitsAsInput(torch.nn.Module):
        """vLLM's ``LogitsProcessor`` with ``logits_as_input``: it returns its input itself."""

        def __init__(self) -> None:
            super().__init__()
            self.logits_processor = LogitsProcessor(WIDTH, logits_as_input=True)

        def compute_logits(self, hidden: torch.Tensor) -> torch.Tensor:
            return self.logits_processor(None, hidden)

    model = LogitsAsInput()
    scores = torch.randn(3, WIDTH, generator=torch.Generator().manual_seed(3))
    before = scores.clone()
    assert model.compute_logits(scores) is scores

    mask_logits(model, VOCAB, BANNED)
    masked = model.compute_logits(scores)

    assert torch.equal(scores, before)
    assert torch.equal(masked[:, KEPT], before[:, KEPT])
    assert torch.isneginf(masked[:, MASKED]).all()
