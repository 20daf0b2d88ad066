"""What a LoRA run sends to its engine process, for the transport tests of each placement
(tests/modeling/test_lora.py: local processes; tests/scale/test_ray_workers.py: Ray actors).
Not collected on its own (no `test_` prefix)."""

# The fixture model's adapters at rank 16 on all 7 projections, by hand: per layer
# q (64 + 64) 16 + k (64 + 32) 16 + v (64 + 32) 16 + o (64 + 64) 16 + 3 x (64 + 128) 16 = 16384
# parameters; 2 layers, float32: 131072 bytes. The base: 78336 parameters, 313344 bytes.
ADAPTER_BYTES, BASE_BYTES = 2 * 16384 * 4, 78336 * 4


def spy_load_weights(monkeypatch, module) -> list[int]:
    """The size of every load_weights message `module`'s workers encode for their process."""
    sizes, encode = [], module.encode

    def spy(message):
        data = encode(message)
        if "load_weights" in message[:2]:
            sizes.append(len(data))
        return data

    monkeypatch.setattr(module, "encode", spy)
    return sizes


def assert_adapters_only_transport(sizes: list[int], steps: int) -> None:
    """The engine process got the whole weights once, then each version's adapters alone."""
    assert len(sizes) == 1 + steps
    assert sizes[0] > ADAPTER_BYTES + BASE_BYTES
    for size in sizes[1:]:
        assert ADAPTER_BYTES < size < ADAPTER_BYTES + 4096  # the adapters and a message's header
