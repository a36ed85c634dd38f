"""What upstreams print while imported or checked stays out of the doctor's and status's reports.

Upstream code prints in every way there is: ``print``, C-level writes to the file descriptors,
``warnings.warn``, records through logging's last-resort handler. All of it is captured per phase;
patchkit's own config warnings and log records still reach the user.
"""

from __future__ import annotations

import io
import logging
import os
import warnings

from patchkit import Patch, Replace, Variant
from patchkit.doctor import VERIFIED, run
from patchkit.runtime.errors import PatchkitWarning
from patchkit.selfcheck import CheckContext
from patchkit.upstream_output import captured


def noisy_upstream() -> None:
    print("print from upstream")
    os.write(2, b"C-level write from upstream\n")
    warnings.warn("moe_ffn_hidden_size is not set", UserWarning, stacklevel=1)
    logging.getLogger("megatron.core.models.gpt").warning("GPTModel IS DEPRECATED")


def test_every_kind_of_upstream_output_is_captured_and_nothing_reaches_the_terminal(capfd, monkeypatch):
    monkeypatch.setattr(logging.root, "handlers", [])  # as in a process nobody configured: the last resort prints
    report = io.StringIO()
    with captured(report) as upstream:
        noisy_upstream()
    out, err = capfd.readouterr()
    assert (out, err, report.getvalue()) == ("", "", "")
    for line in ("print from upstream", "C-level write from upstream", "moe_ffn_hidden_size is not set",
                 "GPTModel IS DEPRECATED"):
        assert line in upstream.text
    assert upstream.lines == 5  # the warning takes two lines (message, source line)


def test_patchkits_own_warnings_and_records_still_reach_the_user(capfd):
    report = io.StringIO()
    with captured(report) as upstream:
        warnings.warn("patchkit: nothing applied: PATCHKIT_DISABLE=...", PatchkitWarning, stacklevel=1)
        warnings.warn("patchkit: nothing applied: PATCHKIT_DISABLE=...", PatchkitWarning, stacklevel=1)
        logging.getLogger("patchkit.runtime.engine").warning("megatron.x failed to install")
    assert report.getvalue().count("PatchkitWarning: patchkit: nothing applied") == 1  # the same config error once
    assert "megatron.x failed to install" in report.getvalue()
    assert "nothing applied" not in upstream.text and "failed to install" not in upstream.text
    assert capfd.readouterr() == ("", "")


def test_the_descriptors_come_back_when_the_block_raises(capfd):
    report = io.StringIO()
    try:
        with captured(report):
            raise RuntimeError("a check broke")
    except RuntimeError:
        pass
    os.write(1, b"after\n")
    assert capfd.readouterr().out == "after\n"


def prints_a_lot(context: CheckContext) -> None:
    noisy_upstream()


def test_doctor_keeps_each_checks_upstream_output_with_its_verdict(engine, make_upstream, capfd, monkeypatch):
    monkeypatch.setattr(logging.root, "handlers", [])
    up = make_upstream()
    engine.register(Patch(id="toy.noisy", summary="s", why="w", upstream="u", removal="r",
                          self_check=prints_a_lot,
                          variants=(Variant(requires={up.name: ">=1"},
                                            installs=(Replace(up.target("Model.forward"), lambda self, x: x),)),)))
    report = io.StringIO()
    (verdict,), facts = run(engine=engine, device="cpu", quiet=report)
    assert verdict.verdict == VERIFIED
    assert "GPTModel IS DEPRECATED" in verdict.upstream_output and verdict.to_dict()["upstream_output_lines"] == 5
    assert capfd.readouterr() == ("", "")
