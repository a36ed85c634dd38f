"""The runtime's PEP 440 subset agrees with ``packaging`` (which the runtime no longer imports)."""

from __future__ import annotations

import itertools

import pytest
from packaging.specifiers import SpecifierSet as PSpecifierSet
from packaging.version import Version as PVersion

from patchkit.runtime import pep440

VERSIONS = [
    "0", "0.14", "0.14.0", "0.14.0rc0", "0.14.0rc1", "0.14.0a1", "0.14.0b2", "0.14.0.dev0", "0.14.0rc1.dev3",
    "0.14.0.post1", "0.14.0.post1.dev1", "0.14.0+local", "0.14.0+abc.7", "0.14.0+7", "0.14.1", "0.15.3",
    "0.16.0rc0", "0.19.2", "0.20.0", "0.20.0rc2", "0.47.0", "0.48.0rc1", "0.48.0", "0.48", "0.48.0.post2",
    "0.48.1", "1!0.1", "1.0", "1.0.0.0", "2.0a1", "v0.48.0", "0.48.0-1", "0.48.0.RC1", "0.48.0_beta_2",
    "0.48.0-dev", "0.48.0pre3", "0.48.0preview4", "0.48.0c5", "0.48.0rev6", "0.48.0r7", "0.48.0alpha8",
]
SPECS = [
    ">=0.14,<0.20", ">=0.14.0rc0,<0.20.0rc0", "<0.48", "<0.48.0rc0", "<0.48.0rc2", ">=0.48", ">=0.48.0rc0",
    ">0.48", ">0.48.0rc1", ">0.48.0.post1", "<=0.48", "==0.48.0", "==0.48", "==0.48.*", "==0.14.*", "!=0.48.*",
    "!=0.14.0", "~=0.14.0", "~=0.14", "~=0.48.0rc0", "==0.14.0+local", ">=1!0", "", ">0.14",
    "<0.14.0.post1", ">0.14.0.dev0", "==0.14.0rc1",
    "<0.14.0.post1.dev0", ">0.48.0.post1.dev0", ">0.14.0",
]


@pytest.mark.parametrize("spec", SPECS)
def test_specifier_sets_contain_what_packaging_contains_with_prereleases(spec: str) -> None:
    theirs = PSpecifierSet(spec)
    ours = pep440.SpecifierSet(spec)
    for text in VERSIONS:
        assert ours.contains(text) == theirs.contains(PVersion(text), prereleases=True), (spec, text)


def test_versions_order_as_packaging_orders_them() -> None:
    for a, b in itertools.product(VERSIONS, repeat=2):
        ours = (pep440.parse(a).key() > pep440.parse(b).key()) - (pep440.parse(a).key() < pep440.parse(b).key())
        theirs = (PVersion(a) > PVersion(b)) - (PVersion(a) < PVersion(b))
        assert ours == theirs, (a, b)
        assert pep440.parse(a).is_prerelease == PVersion(a).is_prerelease, a


@pytest.mark.parametrize("text", ["", "abc", "1.0-", "1..0", "0.48.0rc", "1.0+", "1.0+a..b", "==1.0"])
def test_malformed_versions_are_refused_like_packaging(text: str) -> None:
    from packaging.version import InvalidVersion

    try:
        PVersion(text)
    except InvalidVersion:
        with pytest.raises(pep440.InvalidVersion):
            pep440.parse(text)
    else:
        assert pep440.parse(text).key() == pep440.parse(str(PVersion(text))).key()


@pytest.mark.parametrize("spec", [">=", "0.14", ">=0.14,", "=>0.14", "<0.14.*", "~=1", ">=1.0+local", "==abc", "===1.0",
                                  "<=0.14.0+local9"])
def test_malformed_specifiers_are_refused(spec: str) -> None:
    with pytest.raises(pep440.InvalidSpecifier if spec != "==abc" else pep440.InvalidVersion):
        pep440.SpecifierSet(spec).contains("1.0")


#: What the plain form is: release segments with at most a pre-release spelled the canonical way.
PLAIN = r"([0-9]+(?:\.[0-9]+)*)(?:(a|b|rc)([0-9]+))?"


def test_the_plain_form_parses_as_the_full_pattern_does(monkeypatch: pytest.MonkeyPatch) -> None:
    # Start-up reads plain versions (0.19.2, 0.14.0rc0) without compiling the full pattern: same Version.
    import re

    odd = [" 0.19.2 ", "10.200.3000", "1.0b0", "2.0a12", "1.0rc", "1.0arc1", "rc1", "1..2", "1.", ".1", "1.0rcb1",
           "1.0a1b2", "1.0\u0663", "1.0rc\u0663", "1.0c1", "1.0.rc1", "1.0-rc1", "1.0RC1", ""]
    texts = [text.strip() for text in VERSIONS + odd]
    assert [pep440._plain(text) is not None for text in texts] == [bool(re.fullmatch(PLAIN, text)) for text in texts]
    plain = [text for text in texts if re.fullmatch(PLAIN, text)]
    assert len(plain) > 15
    fast = [pep440.parse(text) for text in plain]
    monkeypatch.setattr(pep440, "_plain", lambda text: None)  # the full pattern for every version
    assert fast == [pep440.parse(text) for text in plain]
