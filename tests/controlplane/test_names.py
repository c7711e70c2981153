"""Workload names derived from display names are always valid Kubernetes names (pure function)."""

from __future__ import annotations

import re

from hypothesis import given
from hypothesis import strategies as st

from controlplane.workload import k8s_name

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


@given(st.text(max_size=300))
def test_any_display_name_yields_a_dns_label_of_at_most_45_characters(name: str) -> None:
    derived = k8s_name(name)
    assert DNS_LABEL.match(derived), derived
    assert len(derived) <= 45


def test_readable_names_keep_their_words() -> None:
    assert k8s_name("  Qwen2.5 Chat (7B)  ") == "qwen2-5-chat-7b"
    assert k8s_name("7b-model") == "d-7b-model"
    assert k8s_name("模型").startswith("deployment-")
