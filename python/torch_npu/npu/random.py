"""Random number generation on the npu (the same functions as torch.cuda)."""
from typing import Any, Iterable, List

import torch

from torch_npu import _C

from ._device import _get_device_index, current_device, device_count


class _DefaultGenerators(tuple):
    pass


def _make_default_generators():
    return tuple(_C._default_generator(i) for i in range(device_count()))


default_generators = _make_default_generators()


def _generator(device: Any) -> torch.Generator:
    index = _get_device_index(device)
    if not 0 <= index < len(default_generators):
        raise ValueError(f"npu:{index} does not exist; there are {len(default_generators)} npu device(s)")
    return default_generators[index]


def manual_seed(seed: int) -> None:
    """Seeds the current npu device's generator."""
    _generator(None).manual_seed(int(seed))


def manual_seed_all(seed: int) -> None:
    for gen in default_generators:
        gen.manual_seed(int(seed))


def seed() -> None:
    _generator(None).seed()


def seed_all() -> None:
    for gen in default_generators:
        gen.seed()


def initial_seed() -> int:
    return _generator(None).initial_seed()


def get_rng_state(device: Any = "npu") -> torch.Tensor:
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "npu") -> None:
    _generator(device).set_state(new_state)


def get_rng_state_all() -> List[torch.Tensor]:
    return [gen.get_state() for gen in default_generators]


def set_rng_state_all(new_states: Iterable[torch.Tensor]) -> None:
    for gen, state in zip(default_generators, new_states):
        gen.set_state(state)
