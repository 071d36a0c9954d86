"""Learning-rate schedules for torch optimizers: split them out of parameter groups, then set their values each
iteration (torch's optimizers need numbers as learning rates)."""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from alfish.schedulers.schedules import Scheduler, current_value
from alfish.schedulers.validation import Number, ScheduleError


def split_lr_schedules(param_groups: Sequence[Mapping[str, Any]]) -> tuple[list[dict], dict[str, Scheduler]]:
    """Optimizer-ready copies of `param_groups` and the learning-rate schedule of each scheduled group, by name.

    An algorithm's groups may give ``lr`` as a number or a schedule. torch's optimizers need a number, so each copy's
    ``lr`` is its current value; the schedules come back as ``{group name: schedule}`` for `update_optimizer_lrs`.

    Raises:
        ScheduleError (a ValueError): a scheduled group without a 'name', or two groups with the same name.
    """
    groups, schedules, names = [], {}, set()
    for group in param_groups:
        group = dict(group)
        name = group.get('name')
        if name is not None:
            if name in names:
                raise ScheduleError(f"split_lr_schedules: two parameter groups are named {name!r}")
            names.add(name)
        lr = group.get('lr')
        if isinstance(lr, Scheduler):
            if name is None:
                raise ScheduleError(f"split_lr_schedules: a parameter group with a scheduled lr ({lr.name}) needs a "
                                    f"'name'")
            schedules[name] = lr
            group['lr'] = lr()
        groups.append(group)
    return groups, schedules


def update_optimizer_lrs(optimizer: torch.optim.Optimizer,
                         lrs: Mapping[str, Number | Scheduler]) -> dict[str, float]:
    """Sets the learning rate of each named parameter group to the current value of ``lrs[name]``; returns them.

    Groups are matched by their 'name' entry; groups not named in `lrs` keep their rate. Call it once per iteration,
    after `update_progress`. A tensor ``lr`` (capturable optimizers) is filled in place.

    Raises:
        ScheduleError (a ValueError): a name with no group, or a negative learning rate.
    """
    groups = {group.get('name'): group for group in optimizer.param_groups}
    values = {}
    for name, lr in lrs.items():
        group = groups.get(name)
        if group is None:
            known = ', '.join(repr(n) for n in groups)
            raise ScheduleError(f"update_optimizer_lrs: the optimizer has no parameter group named {name!r}; its "
                                f"groups are: {known}")
        value = current_value(lr)
        if not value >= 0:
            raise ScheduleError(f"update_optimizer_lrs: the learning rate of group {name!r} is {value!r} "
                                f"({getattr(lr, 'name', 'constant')}); it must be >= 0")
        if isinstance(group['lr'], torch.Tensor):
            group['lr'].fill_(value)
        else:
            group['lr'] = value
        values[name] = value
    return values
