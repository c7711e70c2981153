"""Decisions: Choice, Noul, Score, Set and Span questions about a state, answered by the card's decision family."""
