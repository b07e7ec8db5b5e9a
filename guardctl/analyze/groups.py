"""Group statistics over whole columns: per-group order statistics, sums and counts, and
each row's peer figures (median and MAD of its peer group), as the feature tables and the
detectors use them."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


def group_quantiles(
    groups: np.ndarray, ngroups: int, values: np.ndarray, qs: tuple[float, ...]
) -> list[np.ndarray]:
    """The *qs* quantiles (lower element, no interpolation) of *values* in each group.

    NaN values are left out; a group without values gets NaN.
    """
    keep = ~np.isnan(values)
    g, v = groups[keep], values[keep]
    # Sorted by value, then stably by group: each group's values in order, exactly (one float
    # key of group and value would round values a few ulps apart into one, and pick the wrong
    # one). Group numbers held in 16 bits sort by radix, in linear time; more groups sort by
    # one integer key of group and value rank.
    order = np.argsort(v)
    if ngroups <= 1 << 16:
        order = order[np.argsort(g[order].astype(np.uint16), kind="stable")]
    else:
        rank = np.empty(v.size, np.int64)
        rank[order] = np.arange(v.size)
        order = np.argsort(g.astype(np.int64) * max(v.size, 1) + rank)
    sv = v[order]
    counts = np.bincount(g, minlength=ngroups)
    starts = np.cumsum(counts) - counts
    out = []
    for q in qs:
        idx = starts + np.floor(q * np.maximum(counts - 1, 0)).astype(np.int64)
        res = np.full(ngroups, np.nan)
        has = counts > 0
        res[has] = sv[idx[has]]
        out.append(res)
    return out


def group_median(groups: np.ndarray, ngroups: int, values: np.ndarray) -> np.ndarray:
    return group_quantiles(groups, ngroups, values, (0.5,))[0]


def group_count(groups: np.ndarray, ngroups: int) -> np.ndarray:
    return np.bincount(groups, minlength=ngroups)


@dataclass(frozen=True)
class Grouping:
    """Rows numbered by their key's group (groups in the keys' order), and how many groups.

    Figured once per column by the table that holds it (``features.Table.grouping``): the
    detectors compare rows with the same few peer columns' groups a dozen times a pass.
    """

    n: int
    inv: np.ndarray

    @classmethod
    def of(cls, keys: np.ndarray) -> Grouping:
        uniq, inv = np.unique(keys, return_inverse=True)
        return cls(int(uniq.size), inv.reshape(-1))


def peer_stats(
    peers: Grouping, values: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per row: median and MAD of *values* over the rows of its peer group where *mask*.

    Also returns how many peers contributed. Rows outside *mask* still get their
    group's figures (so an idle GPU can be compared with busy ones if wanted).
    """
    n, inv = peers.n, peers.inv
    vals = np.where(mask, values, np.nan)
    med = group_median(inv, n, vals)
    mad = group_median(inv, n, np.abs(vals - med[inv]))
    cnt = group_count(inv[mask & ~np.isnan(values)], n)
    return med[inv], mad[inv], cnt[inv]
