"""The execution core under every surface: prepared model inputs run through Triton, and what requests share.

Surfaces (HTTP), decisions, images and videos all sit above this package and import from it; it imports none of
them, so one deadline rule and one failure → error mapping serve texts, pictures and video frames alike.
"""
