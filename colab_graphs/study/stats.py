"""Correlation of individual and compositional strength over many (member, protocol, dataset) pairs.

Spearman's rho and Kendall's tau-b come from `colab_graphs.audit.estimators.rank_correlation`; the p-value is
Spearman's two-sided test with the t approximation (what `scipy.stats.spearmanr` reports): t = rho sqrt((n-2) /
(1-rho^2)) with n-2 degrees of freedom, computed here with the regularised incomplete beta function so that
the package needs no scipy.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from colab_graphs.audit.estimators import rank_correlation


def spearman_p_value(rho: float | None, n: int) -> float | None:
    """Two-sided p-value of Spearman's rho over `n` pairs (t approximation); None where rho is undefined.

    Example:
        >>> round(spearman_p_value(0.5, 3), 6)  # 1 degree of freedom: a Cauchy tail, 1 - (2/pi) atan(|t|)
        0.666667
    """
    if rho is None or n < 3:
        return None
    if abs(rho) >= 1.0:
        return 0.0
    df = n - 2
    t_squared = rho * rho * df / (1.0 - rho * rho)
    return regularized_incomplete_beta(df / 2.0, 0.5, df / (df + t_squared))


def regularized_incomplete_beta(a: float, b: float, x: float) -> float:
    """I_x(a, b), by its continued fraction (Lentz's method), for a, b > 0 and x in [0, 1].

    Example:
        >>> round(regularized_incomplete_beta(1.0, 1.0, 0.3), 12)  # I_x(1, 1) = x
        0.3
    """
    if not 0.0 <= x <= 1.0:
        raise ValueError(f"x must be in [0, 1], got {x}")
    if x in (0.0, 1.0):
        return x
    log_front = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    front = math.exp(log_front)
    # The fraction converges fast for x below the mean; above it use I_x(a, b) = 1 - I_{1-x}(b, a).
    if x < (a + 1.0) / (a + b + 2.0):
        return front * _beta_fraction(a, b, x) / a
    return 1.0 - front * _beta_fraction(b, a, 1.0 - x) / b


def _beta_fraction(a: float, b: float, x: float, eps: float = 1e-15, max_terms: int = 500) -> float:
    tiny = 1e-300

    def guard(v: float) -> float:
        return tiny if abs(v) < tiny else v

    c, d = 1.0, 1.0 / guard(1.0 - (a + b) * x / (a + 1.0))
    h = d
    for m in range(1, max_terms + 1):
        even = m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m))
        d, c = 1.0 / guard(1.0 + even * d), guard(1.0 + even / c)
        h *= d * c
        odd = -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))
        d, c = 1.0 / guard(1.0 + odd * d), guard(1.0 + odd / c)
        h *= d * c
        if abs(d * c - 1.0) < eps:
            break
    return h


def pair_correlation(individual: Sequence[float], compositional: Sequence[float]) -> dict[str, float | None]:
    """Spearman, Kendall tau-b and Spearman's p-value over paired values (any number of pairs).

    Example:
        >>> pair_correlation([0.2, 0.5, 0.9], [0.1, 0.3, 0.2])["spearman"]
        0.5
    """
    if len(individual) != len(compositional):
        raise ValueError(f"{len(individual)} individual values against {len(compositional)} compositional")
    names = [str(i) for i in range(len(individual))]
    corr = rank_correlation(
        dict(zip(names, individual, strict=True)), dict(zip(names, compositional, strict=True))
    )
    return {**corr, "p_value": spearman_p_value(corr["spearman"], len(names))}
