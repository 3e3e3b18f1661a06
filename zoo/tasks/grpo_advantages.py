"""From rewards to advantages, and the rollout's metrics, as TRL's `GRPOTrainer` forms them.

Rewards arrive per function (`float[rows, functions]`, NaN where a function does not apply),
rows grouped prompt by prompt (`num_generations` consecutive rows per prompt). The weighted sum
of a row skips its NaNs (a row no function scores stays NaN: no signal, advantage 0); the
advantage is the reward minus its group's mean, divided by the standard deviation (Bessel's,
NaNs skipped) plus 1e-4: of the group (`scale_rewards="group"`), of the batch (`"batch"`), or
not divided (`"none"`).
"""

from __future__ import annotations

import warnings

import numpy as np

SCALE_REWARDS = ("group", "batch", "none")


def nanstd(values: np.ndarray, axis: int | None = None) -> np.ndarray:
    """Bessel-corrected standard deviation skipping NaNs (NaN for fewer than two values)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        count = np.sum(~np.isnan(values), axis=axis)
        mean = np.nanmean(values, axis=axis, keepdims=True)
        variance = np.nanmean((values - mean) ** 2, axis=axis)
        correction = np.where(count > 1, count / np.maximum(count - 1, 1), np.nan)
        return np.asarray(np.sqrt(variance * correction))


def weighted_rewards(per_function: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """`float[rows]`: the weighted sum over functions, NaNs skipped; NaN for a row none scores."""
    # float32, as TRL sums them: advantages near 0 keep the same rounding
    per_function, weights = per_function.astype(np.float32), weights.astype(np.float32)
    total = np.nansum(per_function * weights[None, :], axis=1)
    return np.where(np.isnan(per_function).all(axis=1), np.nan, total)


def advantages(rewards: np.ndarray, num_generations: int, scale_rewards: str) -> np.ndarray:
    """`float32[rows]`: each row's advantage within its group of `num_generations` rows."""
    if scale_rewards not in SCALE_REWARDS:
        raise ValueError(f"scale_rewards must be one of {SCALE_REWARDS}, got {scale_rewards!r}")
    groups = rewards.reshape(-1, num_generations)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        means = np.repeat(np.nanmean(groups, axis=1), num_generations)
    out = rewards - means
    if scale_rewards == "group":
        out = out / (np.repeat(nanstd(groups, axis=1), num_generations) + 1e-4)
    elif scale_rewards == "batch":
        out = out / (nanstd(rewards) + 1e-4)
    return np.nan_to_num(out, nan=0.0).astype(np.float32)


def reward_std(rewards: np.ndarray, num_generations: int, scale_rewards: str) -> np.ndarray:
    """The standard deviation each row is compared with (`frac_reward_zero_std` counts zeros)."""
    if scale_rewards == "batch":
        return np.full(rewards.shape, nanstd(rewards))
    return np.repeat(nanstd(rewards.reshape(-1, num_generations), axis=1), num_generations)


def rollout_metrics(
    per_function: np.ndarray,
    weights: np.ndarray,
    names: list[str],
    *,
    num_generations: int,
    scale_rewards: str,
    lengths: np.ndarray,
    truncated: np.ndarray,
) -> dict[str, float]:
    """The rollout's metrics with TRL's names, one number each (NaN where undefined).

    Args:
        per_function: each function's rewards, `[rows, functions]`, NaN where it gave None.
        weights: one weight per function.
        names: the functions' names (`rewards/NAME/mean`).
        num_generations: rows per prompt.
        scale_rewards: group | batch | none (which standard deviation `frac_reward_zero_std`
            counts).
        lengths: each completion's tokens.
        truncated: whether each completion ran out of tokens before its end.
    """
    rewards = weighted_rewards(per_function, weights)
    std = reward_std(rewards, num_generations, scale_rewards)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        metrics = {
            "reward": float(np.nanmean(rewards)),
            "reward_std": float(nanstd(rewards)),
            "frac_reward_zero_std": float(np.mean(np.isclose(std, 0.0))),
        }
        for index, name in enumerate(names):
            metrics[f"rewards/{name}/mean"] = float(np.nanmean(per_function[:, index]))
            metrics[f"rewards/{name}/std"] = float(nanstd(per_function[:, index]))
    terminated = lengths[~truncated] if (~truncated).any() else np.zeros(1)
    metrics |= {
        "completions/mean_length": float(np.mean(lengths)),
        "completions/min_length": float(np.min(lengths)),
        "completions/max_length": float(np.max(lengths)),
        "completions/clipped_ratio": float(np.mean(truncated)),
        "completions/mean_terminated_length": float(np.mean(terminated)),
        "completions/min_terminated_length": float(np.min(terminated)),
        "completions/max_terminated_length": float(np.max(terminated)),
    }
    return metrics
