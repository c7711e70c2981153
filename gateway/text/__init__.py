"""Text to model inputs within a token budget: the one path every surface uses.

``TextEncoder`` frames texts and pairs with the tokenizer's special tokens, reads long texts
only as far as the budget needs, rejects or truncates honestly, and plans windows.
"""

from gateway.text.encoder import Encoded, Overflow, TextEncoder
from gateway.text.envelope import Layout
from gateway.text.errors import InputTooLong, UnsupportedTokenizer
from gateway.text.probe import Facts
from gateway.text.windows import Window, plan_windows

__all__ = [
    "Encoded",
    "Facts",
    "InputTooLong",
    "Layout",
    "Overflow",
    "TextEncoder",
    "UnsupportedTokenizer",
    "Window",
    "plan_windows",
]
