"""Training mechanics: mesh, sharding, schedules, optimizer, train state, step, checkpoints, data, loop.

The trainer is objective-agnostic: it codes against the Objective contract in docs/architecture.md
(init, loss, ema_spec, weight_decay_mask, train_transform) and never looks inside params.
"""
