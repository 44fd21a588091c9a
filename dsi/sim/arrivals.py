"""Arrival processes: sorted arrival times (seconds from 0) over ``duration_s``, from a seeded
``random.Random``, each with a mean rate of ``rate`` arrivals per second.

    poisson   exponential gaps
    bursty    a two-state Markov-modulated Poisson process: calm periods (mean ``calm_s``) and
              bursts (mean ``burst_s``) at ``factor`` times the calm rate, scaled so that the
              long-run mean is ``rate``
    diurnal   rate(t) = rate * (1 + a cos(2 pi (t - peak_s) / period_s)), a = (r - 1) / (r + 1)
              for a peak-to-trough ratio r, drawn by thinning a Poisson process at the peak rate
"""

from __future__ import annotations

import math
import random


def poisson(rng: random.Random, rate: float, duration_s: float) -> list[float]:
    _check(rate, duration_s)
    out, t = [], rng.expovariate(rate)
    while t < duration_s:
        out.append(t)
        t += rng.expovariate(rate)
    return out


def bursty(
    rng: random.Random,
    rate: float,
    duration_s: float,
    factor: float = 8.0,
    burst_s: float = 60.0,
    calm_s: float = 540.0,
) -> list[float]:
    _check(rate, duration_s)
    if factor < 1 or burst_s <= 0 or calm_s <= 0:
        raise ValueError("a burst needs factor >= 1 and burst_s, calm_s > 0")
    calm_rate = rate * (burst_s + calm_s) / (factor * burst_s + calm_s)
    out, t, burst = [], 0.0, False
    while t < duration_s:
        end = min(duration_s, t + rng.expovariate(1.0 / (burst_s if burst else calm_s)))
        r = calm_rate * (factor if burst else 1.0)
        t += rng.expovariate(r)
        while t < end:
            out.append(t)
            t += rng.expovariate(r)
        t, burst = end, not burst
    return out


def diurnal(
    rng: random.Random,
    rate: float,
    duration_s: float,
    peak_to_trough: float = 4.0,
    period_s: float = 86_400.0,
    peak_s: float = 14 * 3600.0,
) -> list[float]:
    _check(rate, duration_s)
    if peak_to_trough < 1 or period_s <= 0:
        raise ValueError("diurnal needs peak_to_trough >= 1 and period_s > 0")
    a = (peak_to_trough - 1) / (peak_to_trough + 1)
    top = rate * (1 + a)
    return [
        t
        for t in poisson(rng, top, duration_s)
        if rng.random() * top < rate * (1 + a * math.cos(2 * math.pi * (t - peak_s) / period_s))
    ]


def _check(rate: float, duration_s: float) -> None:
    if not rate > 0 or not duration_s > 0:
        raise ValueError(f"arrivals need rate > 0 and duration_s > 0, got {rate} / {duration_s}")


PROCESSES = {"poisson": poisson, "bursty": bursty, "diurnal": diurnal}
