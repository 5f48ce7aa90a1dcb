"""The checked-in generated code matches what the generator makes from the specs today."""

from __future__ import annotations

from shoal.protocol import generate, message_classes, messages
from shoal.protocol.api_keys import ApiKey


def test_generated_files_are_current() -> None:
    stale = [path.name for path, text in generate.outputs().items() if path.read_text() != text]
    assert stale == [], f"stale generated files {stale}: run `make generate`"


def test_every_spec_uses_its_generated_class() -> None:
    assert {int(k) for k in ApiKey} == set(messages.REQUESTS)
    for name, codec in messages.CODECS.items():
        assert codec.cls is getattr(message_classes, name)
        for struct in codec.spec.structs:
            assert getattr(codec.cls, struct).__qualname__ == f"{name}.{struct}"
