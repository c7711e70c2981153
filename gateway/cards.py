"""The model card schema the gateway serves by. It lives in sr_common.cards, shared with the build (sr_build) that
builds and tunes by the same cards; the gateway's modules import it from here."""

from sr_common.cards import (
    Card,
    CardError,
    DecisionSpec,
    EmbeddingSpec,
    Golden,
    HeadSpec,
    ImageSpec,
    Limits,
    PrecisionSpec,
    RerankSpec,
    Surface,
    WindowSpec,
    ZeroShot,
    discover,
    load_card,
)

__all__ = ["Card", "CardError", "DecisionSpec", "EmbeddingSpec", "Golden", "HeadSpec", "ImageSpec", "Limits",
           "PrecisionSpec", "RerankSpec", "Surface", "WindowSpec", "ZeroShot", "discover", "load_card"]
