"""Prompt text made of common English words, so that a prompt's token count is predictable.

Each word is one token, with its leading space, in SmolLM2's tokenizer (checked when this list
was written: n words -> n tokens) and in most GPT-style BPE vocabularies, so `text(rng, n)` is
about n tokens for any model. Random words, not real prose: prefix caching only helps where a
workload shares text on purpose.
"""

from __future__ import annotations

import numpy as np

_WORDS = """
the of and to in is that for it as was with be by on not he this are or his from at which but have
an had they you were their one all we can her has there been if more when will would who so no time
people year way day man thing woman life child world school state family student group country
problem hand part place case week company system program question work government number night point
home water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city community
name president team minute idea kid body information back parent face others level office door
health person art war history party result change morning reason research girl guy moment air
teacher force education good new first last long great little own other old big high different small
large next early young important few public bad same able make go know take see come think look want
give use find tell ask seem feel try leave call keep let begin help show hear play run move live
believe bring happen write sit stand lose pay meet include continue set learn lead understand watch
follow stop create speak read spend grow open walk win teach offer remember consider appear buy
serve die send build stay fall cut reach kill raise pass sell decide return explain hope develop
carry break receive agree support hit produce eat cover catch draw choose river mountain table
window garden market road light music paper letter color food tree field animal voice plan order
price value heart course sense street land season answer data model test form film picture energy
note black white red green blue simple clear free full hard easy real sure true whole special human
local social late general
"""
WORDS: tuple[str, ...] = tuple(_WORDS.split())


def text(rng: np.random.Generator, num_words: int) -> str:
    """`num_words` words drawn uniformly (with replacement) from WORDS."""
    picks = rng.integers(0, len(WORDS), size=num_words)
    return " ".join(WORDS[i] for i in picks)
