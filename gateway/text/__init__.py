"""Text to model inputs within a token budget: the one path every surface uses.

``TextEncoder`` frames texts and pairs with the tokenizer's special tokens, reads long texts
only as far as the budget needs, rejects or truncates honestly, and plans windows.
"""

from .encoder import Encoded, Overflow, TextEncoder
from .envelope import Layout
from .errors import InputTooLong, UnsupportedTokenizer
from .probe import Facts
from .windows import Window, plan_windows

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
