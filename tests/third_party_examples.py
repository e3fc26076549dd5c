"""Models written by others, second part: after NumPyro's examples (see
``tests/third_party_models.py``): baseball, networks and sparse priors, time series and smooths,
count and survival likelihoods, handlers and odd supports."""


import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.scipy.special import expit
from numpyro.contrib.control_flow import scan
from numpyro.infer.reparam import (
    LocScaleReparam,
)
from third_party_common import Case

# ---------------------------------------------------------------- baseball (examples/baseball.py)

def _baseball():
    rng = np.random.default_rng(30)
    at_bats = np.full(18, 45)  # Efron and Morris: the first 45 at-bats of 18 players
    return (at_bats,), {"hits": rng.binomial(at_bats, rng.beta(27.0, 75.0, 18))}


# examples/baseball.py fully_pooled
def baseball_fully_pooled(at_bats, hits=None):
    phi_prior = dist.Uniform(0, 1)
    phi = numpyro.sample("phi", phi_prior)
    num_players = at_bats.shape[0]
    with numpyro.plate("num_players", num_players):
        return numpyro.sample("obs", dist.Binomial(at_bats, probs=phi), obs=hits)


# examples/baseball.py not_pooled
def baseball_not_pooled(at_bats, hits=None):
    num_players = at_bats.shape[0]
    with numpyro.plate("num_players", num_players):
        phi_prior = dist.Uniform(0, 1)
        phi = numpyro.sample("phi", phi_prior)
        return numpyro.sample("obs", dist.Binomial(at_bats, probs=phi), obs=hits)


# examples/baseball.py partially_pooled (Beta(m kappa, (1 - m) kappa) with a Pareto kappa)
def baseball_partially_pooled(at_bats, hits=None):
    m = numpyro.sample("m", dist.Uniform(0, 1))
    kappa = numpyro.sample("kappa", dist.Pareto(1, 1.5))
    num_players = at_bats.shape[0]
    with numpyro.plate("num_players", num_players):
        phi_prior = dist.Beta(m * kappa, (1 - m) * kappa)
        phi = numpyro.sample("phi", phi_prior)
        return numpyro.sample("obs", dist.Binomial(at_bats, probs=phi), obs=hits)


# examples/baseball.py partially_pooled_with_logit
def baseball_partially_pooled_logit(at_bats, hits=None):
    loc = numpyro.sample("loc", dist.Normal(-1, 1))
    scale = numpyro.sample("scale", dist.HalfCauchy(1))
    num_players = at_bats.shape[0]
    with numpyro.plate("num_players", num_players):
        alpha = numpyro.sample("alpha", dist.Normal(loc, scale))
        return numpyro.sample("obs", dist.Binomial(at_bats, logits=alpha), obs=hits)


# ---------------------------------------------------------------- networks and sparse priors

# examples/bnn.py with one hidden layer of 5 tanh units (the original has two) and 20 points
def bnn(X, Y, D_H):
    D_X, D_Y = X.shape[1], 1
    w1 = numpyro.sample("w1", dist.Normal(jnp.zeros((D_X, D_H)), jnp.ones((D_X, D_H))))  # D_X D_H
    z1 = jnp.tanh(jnp.matmul(X, w1))  # N D_H
    w2 = numpyro.sample("w2", dist.Normal(jnp.zeros((D_H, D_Y)), jnp.ones((D_H, D_Y))))  # D_H D_Y
    z2 = jnp.matmul(z1, w2)  # N D_Y
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
    sigma_obs = 1.0 / jnp.sqrt(prec_obs)
    numpyro.sample("Y", dist.Normal(z2, sigma_obs), obs=Y)


def _bnn():
    rng = np.random.default_rng(31)
    N, D_X = 20, 3
    X = np.power(np.linspace(-1, 1, N)[:, np.newaxis], np.arange(D_X))
    Y = X @ (0.5 * rng.normal(size=D_X)) + 0.5 * (0.5 + X[:, 1]) ** 2 * np.sin(4.0 * X[:, 1])
    Y = (Y + 0.05 * rng.normal(size=N))[:, np.newaxis]
    return Case(bnn, (X, (Y - Y.mean()) / Y.std(), 5), {}, "continuous",
                "tanh network: 2^5 * 5! equivalent modes (sign flips, unit swaps); Y of shape (N, 1)")


# examples/horseshoe_regression.py model_normal_likelihood, p = 20
def horseshoe_regression(X, Y):
    D_X = X.shape[1]
    lambdas = numpyro.sample("lambdas", dist.HalfCauchy(jnp.ones(D_X)))
    tau = numpyro.sample("tau", dist.HalfCauchy(jnp.ones(1)))
    unscaled_betas = numpyro.sample("unscaled_betas", dist.Normal(0.0, jnp.ones(D_X)))
    scaled_betas = numpyro.deterministic("betas", tau * lambdas * unscaled_betas)
    mean_function = jnp.dot(X, scaled_betas)
    prec_obs = numpyro.sample("prec_obs", dist.Gamma(3.0, 1.0))
    sigma_obs = 1.0 / jnp.sqrt(prec_obs)
    numpyro.sample("Y", dist.Normal(mean_function, sigma_obs), obs=Y)


def _sparse_data(seed, N, D_X):
    rng = np.random.default_rng(seed)
    X = rng.normal(size=(N, D_X))
    Y = X[:, :3] @ np.array([2.0, -1.0, 0.5])  # only the first 3 of D_X columns matter
    return X, Y - Y.mean() + 0.3 * rng.normal(size=N)


# examples/hsgp.py yearday_effect: regularised horseshoe (slab through c_aux), centred beta
def regularised_horseshoe(X, y=None, slab_df=4.0, slab_scale=2.0, scale_global=0.1):
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2 * scale_global))
    c_aux = numpyro.sample("c_aux", dist.InverseGamma(0.5 * slab_df, 0.5 * slab_df))
    c = slab_scale * jnp.sqrt(c_aux)
    with numpyro.plate("features", X.shape[1]):
        lam = numpyro.sample("lam", dist.HalfCauchy(scale=1))
        lam_tilde = jnp.sqrt(c) * lam / jnp.sqrt(c + (tau * lam) ** 2)
        beta = numpyro.sample("beta", dist.Normal(loc=0, scale=tau * lam_tilde))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Normal(intercept + X @ beta, sigma), obs=y)


def _regularised_horseshoe():
    X, y = _sparse_data(56, 60, 20)
    return Case(regularised_horseshoe, (X,), {"y": y}, "continuous",
                "centred regularised horseshoe: InverseGamma slab; a funnel per feature")


# ---------------------------------------------------------------- time series and smooths

# examples/holt_winters.py (level, trend and seasonality in contrib scan), 40 points, 4 seasons
def holt_winters(y, n_seasons, future=0):
    y = jnp.asarray(y)  # indexed by the scan counter: a numpy array cannot take the tracer
    T = y.shape[0]
    level_smoothing = numpyro.sample("level_smoothing", dist.Beta(1, 1))
    trend_smoothing = numpyro.sample("trend_smoothing", dist.Beta(1, 1))
    seasonality_smoothing = numpyro.sample("seasonality_smoothing", dist.Beta(1, 1))
    adj_seasonality_smoothing = seasonality_smoothing * (1 - level_smoothing)
    noise = numpyro.sample("noise", dist.HalfNormal(1))
    level_init = numpyro.sample("level_init", dist.Normal(0, 1))
    trend_init = numpyro.sample("trend_init", dist.Normal(0, 1))
    with numpyro.plate("n_seasons", n_seasons):
        seasonality_init = numpyro.sample("seasonality_init", dist.Normal(0, 1))

    def transition_fn(carry, t):
        previous_level, previous_trend, previous_seasonality = carry
        level = jnp.where(
            t < T,
            level_smoothing * (y[t] - previous_seasonality[0])
            + (1 - level_smoothing) * (previous_level + previous_trend),
            previous_level,
        )
        trend = jnp.where(
            t < T,
            trend_smoothing * (level - previous_level) + (1 - trend_smoothing) * previous_trend,
            previous_trend,
        )
        new_season = jnp.where(
            t < T,
            adj_seasonality_smoothing * (y[t] - (previous_level + previous_trend))
            + (1 - adj_seasonality_smoothing) * previous_seasonality[0],
            previous_seasonality[0],
        )
        step = jnp.where(t < T, 1, t - T + 1)
        mu = previous_level + step * previous_trend + previous_seasonality[0]
        pred = numpyro.sample("pred", dist.Normal(mu, noise))
        seasonality = jnp.concatenate([previous_seasonality[1:], new_season[None]], axis=0)
        return (level, trend, seasonality), pred

    with numpyro.handlers.condition(data={"pred": y}):
        _, preds = scan(transition_fn, (level_init, trend_init, seasonality_init), jnp.arange(T + future))
    if future > 0:
        numpyro.deterministic("y_forecast", preds[-future:])


def _holt_winters():
    rng = np.random.default_rng(32)
    t = np.linspace(0, 10, 40)  # 4 points per unit, as N_POINTS_PER_UNIT = 4
    return Case(holt_winters, (np.sin(2 * np.pi * t) + 0.3 * t + 0.1 * rng.normal(size=40), 4), {},
                "continuous", "scan over a conditioned site; three Beta smoothing weights; jnp.where on t")


# examples/mortality.py (age, two-tier space, year), shrunk to 4 ages x 5 areas x 6 years; logits
# around an offset (the crude log-odds) with N(0, 1), not N(0, 10), first drifts: with N(0, 10),
# NUTS stays stuck at its initial point for about half of the seeds
@numpyro.handlers.reparam(
    config={k: LocScaleReparam(0) for k in ["alpha_s1", "alpha_s2", "alpha_age_drift", "beta_age_drift", "pi_drift"]}
)
def mortality(age, space, time, lookup, population, offset, deaths=None):
    N_s1 = len(np.unique(lookup))
    N_s2 = len(np.unique(space))
    N_age = len(np.unique(age))
    N_t = len(np.unique(time))
    N = len(population)
    age_plate = numpyro.plate("age_groups", N_age, dim=-3)
    space_plate = numpyro.plate("space", N_s2, dim=-2)
    year_plate = numpyro.plate("year", N_t - 1, dim=-1)
    sigma_alpha_s1 = numpyro.sample("sigma_alpha_s1", dist.HalfNormal(1.0))
    sigma_alpha_s2 = numpyro.sample("sigma_alpha_s2", dist.HalfNormal(1.0))
    sigma_alpha_age = numpyro.sample("sigma_alpha_age", dist.HalfNormal(1.0))
    sigma_beta_age = numpyro.sample("sigma_beta_age", dist.HalfNormal(1.0))
    sigma_pi = numpyro.sample("sigma_nu", dist.HalfNormal(1.0))
    with numpyro.plate("s1", N_s1, dim=-2):
        alpha_s1 = numpyro.sample("alpha_s1", dist.Normal(0, sigma_alpha_s1))
    with space_plate:
        alpha_s2 = numpyro.sample("alpha_s2", dist.Normal(alpha_s1[lookup], sigma_alpha_s2))
    with age_plate:
        alpha_age_drift_scale = jnp.pad(
            jnp.broadcast_to(sigma_alpha_age, N_age - 1), (1, 0), constant_values=1.0
        )[:, jnp.newaxis, jnp.newaxis]
        alpha_age_drift = numpyro.sample("alpha_age_drift", dist.Normal(0, alpha_age_drift_scale))
        alpha_age = jnp.cumsum(alpha_age_drift, -3)
        beta_age_drift_scale = jnp.pad(
            jnp.broadcast_to(sigma_beta_age, N_age - 1), (1, 0), constant_values=1.0
        )[:, jnp.newaxis, jnp.newaxis]
        beta_age_drift = numpyro.sample("beta_age_drift", dist.Normal(0, beta_age_drift_scale))
        beta_age = jnp.cumsum(beta_age_drift, -3)
        beta_age_cum = jnp.outer(beta_age, jnp.arange(N_t))[:, jnp.newaxis, :]
    with year_plate:
        pi_drift = numpyro.sample("pi_drift", dist.Normal(0, sigma_pi))
        pi = jnp.pad(jnp.cumsum(pi_drift, -1), (1, 0))
    latent_rate = alpha_age + beta_age_cum + alpha_s2 + pi  # (age, space, year)
    with numpyro.plate("N", N):
        mu_logit = offset + latent_rate[age, space, time]
        mu = numpyro.deterministic("mu", expit(mu_logit))
        numpyro.sample("deaths", dist.Binomial(population, mu), obs=deaths)


def _mortality():
    rng = np.random.default_rng(33)
    age, space, time = (a.ravel() for a in np.meshgrid(np.arange(4), np.arange(5), np.arange(6), indexing="ij"))
    lookup = np.array([0, 0, 0, 1, 1])  # area (s2) -> region (s1)
    s2 = rng.normal(0.0, 0.3, 2)[lookup] + rng.normal(0.0, 0.15, 5)
    logit = -6.0 + 0.9 * age + s2[space] - 0.03 * time + np.cumsum(rng.normal(0.0, 0.05, 6))[time]
    population = rng.integers(2000, 8000, len(age))
    deaths = rng.binomial(population, 1 / (1 + np.exp(-logit)))
    offset = np.log(deaths.sum() / (population.sum() - deaths.sum()))
    return Case(mortality, (age, space, time, lookup, population, offset), {"deaths": deaths}, "continuous",
                "plates at dims -3, -2, -1 and a decorator reparametrising 5 sites (LocScaleReparam(0))")


def _eigenfunctions(x, L, M):
    m1 = (jnp.pi / (2 * L)) * jnp.tile(L + x[:, None], M)
    m2 = jnp.diag(jnp.linspace(1, M, num=M))
    return jnp.sin(m1 @ m2) / jnp.sqrt(L)


def _diag_spectral_density(alpha, length, L, M):
    sqrt_eigenvalues = jnp.arange(1, 1 + M) * jnp.pi / 2 / L
    return alpha * jnp.sqrt(2 * jnp.pi) * length * jnp.exp(-0.5 * (length**2) * (sqrt_eigenvalues**2))


def _trend_gp(x, L, M):
    alpha = numpyro.sample("alpha", dist.HalfNormal(1.0))
    length = numpyro.sample("length", dist.InverseGamma(10.0, 2.0))
    phi = _eigenfunctions(x, L, M)
    spd = jnp.sqrt(_diag_spectral_density(alpha, length, L, M))
    with numpyro.plate("basis", M):
        beta = numpyro.sample("beta", dist.Normal(0, 1))
    return numpyro.deterministic("f", phi @ (spd * beta))


# examples/hsgp.py (Hilbert-space GP, non-centred basis weights) with its trend component only
def hsgp(x, L, M, y=None):
    intercept = numpyro.sample("intercept", dist.Normal(0, 1))
    f = numpyro.handlers.scope(_trend_gp, "trend")(x, L, M)  # sites "trend/alpha", "trend/beta", ...
    sigma = numpyro.sample("sigma", dist.HalfNormal(0.5))
    with numpyro.plate("obs", x.shape[0]):
        numpyro.sample("y", dist.Normal(intercept + f, sigma), obs=y)


def _hsgp():
    rng = np.random.default_rng(34)
    x = np.sort(rng.uniform(-2.0, 2.0, 50))
    y = np.sin(2.0 * x) + 0.3 * x + 0.2 * rng.normal(size=50)
    xsd = (x - x.mean()) / x.std()
    return Case(hsgp, (xsd, 1.5 * np.max(np.abs(xsd)), 10), {"y": (y - y.mean()) / y.std()}, "continuous",
                "scope handler: '/' in site names; InverseGamma length scale; deterministic f")


# ---------------------------------------------------------------- count and survival likelihoods

# notebooks/source/gmm.ipynb marginalised: MixtureSameFamily with Dirichlet weights, 3 components
def mixture_dirichlet(y, K=3):
    weights = numpyro.sample("weights", dist.Dirichlet(0.5 * jnp.ones(K)))
    with numpyro.plate("components", K):
        locs = numpyro.sample("locs", dist.Normal(0.0, 10.0))
    scale = numpyro.sample("scale", dist.LogNormal(0.0, 1.0))
    mix = dist.MixtureSameFamily(dist.Categorical(probs=weights), dist.Normal(locs, scale))
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", mix, obs=y)


def _mixture_dirichlet():
    rng = np.random.default_rng(35)
    y = np.concatenate([rng.normal(-4.0, 1.0, 30), rng.normal(0.0, 1.0, 50), rng.normal(5.0, 1.0, 20)])
    return Case(mixture_dirichlet, (y,), {}, "continuous",
                "simplex weights and unordered locs: 3! label-switched modes")


# examples/zero_inflated_poisson.py (gate and rate both regressions on X with an intercept column)
def zero_inflated_poisson(X, Y):
    D_X = X.shape[1]
    b1 = numpyro.sample("b1", dist.Normal(0.0, 1.0).expand([D_X]).to_event(1))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 1.0).expand([D_X]).to_event(1))
    q = expit(jnp.dot(X, b1[:, None])).reshape(-1)
    lam = jnp.exp(jnp.dot(X, b2[:, None]).reshape(-1))
    with numpyro.plate("obs", X.shape[0]):
        numpyro.sample("Y", dist.ZeroInflatedPoisson(gate=q, rate=lam), obs=Y)


def _zero_inflated_poisson():
    rng = np.random.default_rng(36)
    X = np.column_stack([rng.normal(size=(150, 2)), np.ones(150)])
    zero = rng.random(150) < 1 / (1 + np.exp(-(X @ np.array([0.8, 0.0, -0.5]))))
    Y = np.where(zero, 0, rng.poisson(np.exp(X @ np.array([0.0, 0.5, 1.0]))))
    return Case(zero_inflated_poisson, (X, Y), {}, "continuous",
                "ZeroInflatedPoisson: two regressions share the zeros (weakly identified gate)")


# examples/zero_inflated_poisson.py layout with a negative binomial (GammaPoisson) likelihood
def negative_binomial(X, Y=None):
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([X.shape[1]]).to_event(1))
    concentration = numpyro.sample("concentration", dist.Gamma(2.0, 0.5))
    mu = jnp.exp(X @ b)
    with numpyro.plate("obs", X.shape[0]):
        numpyro.sample("Y", dist.GammaPoisson(concentration, rate=concentration / mu), obs=Y)


def _negative_binomial():
    rng = np.random.default_rng(37)
    X = np.column_stack([np.ones(120), rng.normal(size=(120, 2))])
    mu = np.exp(X @ np.array([1.5, 0.6, -0.3]))
    return Case(negative_binomial, (X,), {"Y": rng.negative_binomial(3.0, 3.0 / (3.0 + mu))}, "continuous",
                "GammaPoisson (NB2) with the rate computed from the mean; overdispersion latent")


# examples/stochastic_volatility.py's StudentT with a learned df, in a regression with outliers
def student_t_regression(x, y=None):
    alpha = numpyro.sample("alpha", dist.Normal(0.0, 10.0))
    beta = numpyro.sample("beta", dist.Normal(0.0, 10.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(5.0))
    nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
    with numpyro.plate("data", len(x)):
        numpyro.sample("y", dist.StudentT(nu, alpha + beta * x, sigma), obs=y)


def _student_t():
    rng = np.random.default_rng(38)
    x = rng.uniform(-2.0, 2.0, 60)
    y = 1.0 + 2.0 * x + 0.5 * rng.normal(size=60)
    y[rng.choice(60, 5, replace=False)] += rng.choice([-8.0, 8.0], 5)
    return Case(student_t_regression, (x,), {"y": y}, "continuous",
                "learned degrees of freedom: a long right tail in nu; 5 gross outliers")


# notebooks/source/ordinal_regression.ipynb (model with TransformedDistribution + OrderedTransform)
def ordinal_regression(X, Y=None, nclasses=3):
    b_X_eta = numpyro.sample("b_X_eta", dist.Normal(0, 5))
    c_y = numpyro.sample(
        "c_y",
        dist.TransformedDistribution(dist.Normal(0, 1).expand([nclasses - 1]), dist.transforms.OrderedTransform()),
    )
    with numpyro.plate("obs", X.shape[0]):
        eta = X * b_X_eta
        numpyro.sample("Y", dist.OrderedLogistic(eta, c_y), obs=Y)


def _ordinal():
    rng = np.random.default_rng(39)
    Y = rng.integers(0, 3, 50)
    return Case(ordinal_regression, (rng.normal(size=50) + Y,), {"Y": Y}, "continuous",
                "ordered_vector support of cutpoints through a TransformedDistribution")


# notebooks/source/truncated_distributions.ipynb: a TruncatedNormal likelihood, known upper bound
def truncated_normal(num_observations, high, x=None):
    loc = numpyro.sample("loc", dist.Normal())
    scale = numpyro.sample("scale", dist.LogNormal())
    with numpyro.plate("observations", num_observations):
        numpyro.sample("x", dist.TruncatedNormal(loc, scale, high=high), obs=x)


def _truncated_normal():
    x = np.random.default_rng(40).normal(1.0, 1.5, 200)
    x = x[x < 1.25][:80]  # only values below the bound are ever recorded
    return Case(truncated_normal, (80, 1.25), {"x": x}, "continuous",
                "truncation point inside the bulk: loc and scale trade off along a ridge")


# notebooks/source/censoring.ipynb's CDF likelihood (the Uber post it cites) by hand: factor + log_cdf
def censored_normal(y, censored, limit):
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", dist.Normal(mu, sigma).mask(~censored), obs=y)
    numpyro.factor("censored", jnp.sum(censored * dist.Normal(mu, sigma).log_cdf(limit)))


def _censored():
    y = np.random.default_rng(41).normal(0.5, 1.2, 80)
    censored = y < 0.0  # below the detection limit: reported as the limit
    return Case(censored_normal, (np.where(censored, 0.0, y), censored, 0.0), {}, "continuous",
                "masked likelihood plus numpyro.factor of Normal.log_cdf for left-censored points")


# no NumPyro original: the BUGS "pumps" example (Gamma failure rates, operating hours as exposure)
def pumps(t, x=None):
    alpha = numpyro.sample("alpha", dist.Exponential(1.0))
    beta = numpyro.sample("beta", dist.Gamma(0.1, 1.0))
    with numpyro.plate("pumps", len(t)):
        theta = numpyro.sample("theta", dist.Gamma(alpha, beta))
        numpyro.sample("x", dist.Poisson(theta * t), obs=x)


def _pumps():
    rng = np.random.default_rng(42)
    t = np.round(np.exp(rng.uniform(0.0, 5.0, 10)), 2)  # 1 to 150 thousand hours
    return Case(pumps, (t,), {"x": rng.poisson(rng.gamma(0.7, 1 / 0.9, 10) * t)}, "continuous",
                "hierarchical Gamma-Poisson with exposures spanning two decades; Gamma(0.1, 1) hyperprior")


# no NumPyro original: PyMC's coal-mining switchpoint as users port it (continuous tau, sigmoid switch)
def change_point(years, disasters=None):
    early_rate = numpyro.sample("early_rate", dist.Exponential(1.0))
    late_rate = numpyro.sample("late_rate", dist.Exponential(1.0))
    switchpoint = numpyro.sample("switchpoint", dist.Uniform(years.min(), years.max()))
    rate = early_rate + (late_rate - early_rate) * expit(2.0 * (years - switchpoint))
    with numpyro.plate("years", len(years)):
        numpyro.sample("disasters", dist.Poisson(rate), obs=disasters)


def _change_point():
    rng = np.random.default_rng(43)
    years = np.arange(1851.0, 1962.0)
    return Case(change_point, (years,), {"disasters": rng.poisson(np.where(years < 1890, 3.0, 0.9))},
                "continuous", "switchpoint on an interval of years ~1900: rough, possibly multimodal profile")


# examples/capture_recapture.py model_4 (survival by sex), the alive state summed out by hand
def cjs(capture_history, sex):
    N, T = capture_history.shape
    phi_male = numpyro.sample("phi_male", dist.Uniform(0.0, 1.0))
    phi_female = numpyro.sample("phi_female", dist.Uniform(0.0, 1.0))
    phi = sex * phi_male + (1.0 - sex) * phi_female
    rho = numpyro.sample("rho", dist.Uniform(0.0, 1.0))  # recapture probability
    first = np.argmax(capture_history, axis=1)  # first capture, from the data
    alive, dead = jnp.ones(N), jnp.zeros(N)  # P(state at t, history to t | first capture)
    for t in range(1, T):
        y, started = capture_history[:, t], t > first
        new_alive = alive * phi * jnp.where(y == 1, rho, 1.0 - rho)
        new_dead = jnp.where(y == 1, 0.0, dead + alive * (1.0 - phi))
        alive, dead = jnp.where(started, new_alive, alive), jnp.where(started, new_dead, dead)
    with numpyro.plate("animals", N):
        numpyro.factor("histories", jnp.log(alive + dead))


def _cjs():
    rng = np.random.default_rng(44)
    N, T = 100, 7
    sex = rng.integers(0, 2, N)
    first = rng.integers(0, T - 1, N)
    history, alive = np.zeros((N, T), dtype=int), np.ones(N, dtype=bool)
    history[np.arange(N), first] = 1
    for t in range(1, T):
        started = t > first
        alive = np.where(started, alive & (rng.random(N) < np.where(sex == 1, 0.6, 0.75)), alive)
        history[:, t] = np.where(started, alive & (rng.random(N) < 0.8), history[:, t])
    return Case(cjs, (history, sex.astype(float)), {}, "continuous",
                "discrete alive states summed by hand; a factor inside a plate; Uniform(0, 1) latents")


# examples/baseball.py partially_pooled with each player's phi integrated out (BetaBinomial)
def beta_binomial(at_bats, hits=None):
    m = numpyro.sample("m", dist.Beta(2.0, 2.0))
    kappa = numpyro.sample("kappa", dist.Gamma(2.0, 0.1))
    with numpyro.plate("num_players", at_bats.shape[0]):
        numpyro.sample("obs", dist.BetaBinomial(m * kappa, (1 - m) * kappa, total_count=at_bats), obs=hits)


def _beta_binomial():
    rng = np.random.default_rng(45)
    at_bats = rng.integers(10, 60, 30)
    return Case(beta_binomial, (at_bats,), {"hits": rng.binomial(at_bats, rng.beta(6.0, 14.0, 30))},
                "continuous", "BetaBinomial with mean-concentration parameters; heavy-tailed kappa")


# test/infer/test_mcmc.py::test_logistic_regression grown to three classes: Categorical(logits)
def softmax_regression(X, y=None, num_classes=3):
    W = numpyro.sample("W", dist.Normal(0.0, 1.0).expand([X.shape[1], num_classes]).to_event(2))
    b = numpyro.sample("b", dist.Normal(0.0, 1.0).expand([num_classes]).to_event(1))
    with numpyro.plate("data", X.shape[0]):
        numpyro.sample("y", dist.Categorical(logits=X @ W + b), obs=y)


def _softmax():
    rng = np.random.default_rng(46)
    X = rng.normal(size=(150, 2))
    logits = X @ np.array([[1.5, -1.0, 0.0], [0.0, 1.0, -1.5]])
    p = np.exp(logits - logits.max(1, keepdims=True))
    y = (rng.random((150, 1)) > np.cumsum(p / p.sum(1, keepdims=True), 1)).sum(1)
    return Case(softmax_regression, (X,), {"y": y}, "continuous",
                "matrix-valued latent (to_event(2)); logits shift-invariant, identified by the prior only")


# numpyro.handlers.scale docstring (stratified sampling): downsampled negatives weighted by 10
def weighted_logistic(x, labels, weights):
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", len(x)), numpyro.handlers.scale(scale=weights):
        numpyro.sample("obs", dist.Bernoulli(logits=a + b * x), obs=labels)


def _weighted_logistic():
    rng = np.random.default_rng(47)
    x = rng.normal(size=2000)
    labels = rng.random(2000) < 1 / (1 + np.exp(-(-3.0 + 1.5 * x)))
    keep = labels | (rng.random(2000) < 0.1)  # every positive, a tenth of the negatives
    return Case(weighted_logistic, (x[keep], labels[keep].astype(float), np.where(labels[keep], 1.0, 10.0)), {},
                "continuous", "per-point handlers.scale array: the density is a weighted, not a true, likelihood")


# examples/mortality.py plate layout (dim=-2 over rows, dim=-1 over columns) as a crossed design
def crossed_effects(y):
    R, C = y.shape
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    sigma_row = numpyro.sample("sigma_row", dist.HalfNormal(1.0))
    sigma_col = numpyro.sample("sigma_col", dist.HalfNormal(1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    rows = numpyro.plate("rows", R, dim=-2)
    cols = numpyro.plate("cols", C, dim=-1)
    with cols:
        col = numpyro.sample("col", dist.Normal(0.0, sigma_col))  # (C,)
    with rows:
        row = numpyro.sample("row", dist.Normal(0.0, sigma_row))  # (R, 1)
        with cols:
            numpyro.sample("y", dist.Normal(mu + row + col, sigma), obs=y)


def _crossed():
    rng = np.random.default_rng(48)
    y = 2.0 + rng.normal(0.0, 0.8, (6, 1)) + rng.normal(0.0, 0.5, 5) + rng.normal(0.0, 0.4, (6, 5))
    return Case(crossed_effects, (y,), {}, "continuous",
                "two nested plates (dim=-2, dim=-1): a latent of shape (6, 1) next to one of shape (5,)")


# dist.RightCensoredDistribution docstring's Exponential base (uncensored), a LogNormal rate per arm
def exponential_times(arm, times):
    with numpyro.plate("arms", 2):
        rate = numpyro.sample("rate", dist.LogNormal(-1.0, 1.0))
    with numpyro.plate("data", len(times)):
        numpyro.sample("times", dist.Exponential(rate[arm]), obs=times)


def _exponential():
    rng = np.random.default_rng(49)
    arm = np.repeat([0, 1], [30, 10])
    return Case(exponential_times, (arm, rng.exponential(np.where(arm == 0, 4.0, 12.0))), {}, "continuous",
                "positive data with Exponential likelihood; 10 points only for the second rate")


# examples/baseball.py's Uniform priors, the bounds taken from other sample sites
def uniform_bounds(group, y):
    lower = numpyro.sample("lower", dist.Normal(0.0, 2.0))
    span = numpyro.sample("span", dist.LogNormal(1.0, 0.5))
    with numpyro.plate("groups", 4):
        mu = numpyro.sample("mu", dist.Uniform(lower, lower + span))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", dist.Normal(mu[group], sigma), obs=y)


def _uniform_bounds():
    rng = np.random.default_rng(50)
    group = np.repeat(np.arange(4), 10)
    return Case(uniform_bounds, (group, np.array([1.2, 1.8, 2.5, 3.0])[group] + 0.5 * rng.normal(size=40)), {},
                "continuous", "support of mu moves with the latent sites lower and span (dependent interval)")


# examples/capture_recapture.py model_3: handlers.reparam with LocScaleReparam as a context manager
def varying_slopes(group, x, y=None):
    n_groups = len(np.unique(group))
    mu_a = numpyro.sample("mu_a", dist.Normal(0.0, 5.0))
    mu_b = numpyro.sample("mu_b", dist.Normal(0.0, 5.0))
    sigma_a = numpyro.sample("sigma_a", dist.HalfNormal(1.0))
    sigma_b = numpyro.sample("sigma_b", dist.HalfNormal(1.0))
    reparam = {"a": LocScaleReparam(centered=0), "b": LocScaleReparam(centered=0)}
    with numpyro.handlers.reparam(config=reparam), numpyro.plate("groups", n_groups):
        a = numpyro.sample("a", dist.Normal(mu_a, sigma_a))
        b = numpyro.sample("b", dist.Normal(mu_b, sigma_b))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    with numpyro.plate("data", len(x)):
        numpyro.sample("y", dist.Normal(a[group] + b[group] * x, sigma), obs=y)


def _varying_slopes():
    rng = np.random.default_rng(51)
    group, x = np.repeat(np.arange(8), 10), rng.normal(size=80)
    y = rng.normal(1.0, 0.5, 8)[group] + rng.normal(-0.5, 0.3, 8)[group] * x + 0.4 * rng.normal(size=80)
    return Case(varying_slopes, (group, x), {"y": y}, "continuous",
                "reparam context manager around a plate: a_decentered, b_decentered latent; a, b deterministic")


# no NumPyro original: the "broken stick" users write with jnp.where on a latent breakpoint
def broken_stick(x, y=None):
    c = numpyro.sample("c", dist.Normal(0.0, 2.0))
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b1 = numpyro.sample("b1", dist.Normal(0.0, 2.0))
    b2 = numpyro.sample("b2", dist.Normal(0.0, 2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    mu = jnp.where(x < c, a + b1 * (x - c), a + b2 * (x - c))
    with numpyro.plate("data", len(x)):
        numpyro.sample("y", dist.Normal(mu, sigma), obs=y)


def _broken_stick():
    rng = np.random.default_rng(52)
    x = rng.uniform(-3.0, 3.0, 60)
    y = np.where(x < 0.5, 1.0 + 0.2 * (x - 0.5), 1.0 + 1.5 * (x - 0.5)) + 0.3 * rng.normal(size=60)
    return Case(broken_stick, (x,), {"y": y}, "continuous",
                "jnp.where on a latent breakpoint: the gradient in c jumps at every data point")


# docstring example of dist.ZeroSumNormal (category effects that sum to zero)
def zero_sum_effects(category_ind, y, n_categories=8):
    alpha = numpyro.sample("alpha", dist.Normal(0, 2.5))
    beta = numpyro.sample("beta", dist.ZeroSumNormal(1, event_shape=(n_categories,)))
    sigma = numpyro.sample("sigma", dist.Exponential(1))
    with numpyro.plate("obs", len(category_ind)):
        numpyro.sample("y", dist.Normal(alpha + beta[category_ind], sigma), obs=y)


def _zero_sum():
    rng = np.random.default_rng(53)
    category_ind = rng.integers(0, 8, 120)
    beta = rng.normal(size=8)
    return Case(zero_sum_effects, (category_ind, 5.0 + (beta - beta.mean())[category_ind] + rng.normal(size=120)),
                {}, "continuous", "zero_sum support: 8 coordinates, 7 free dimensions")


def _lkj_mvn_data():
    rng = np.random.default_rng(54)
    sd = np.array([1.0, 2.0, 0.5, 1.5])
    corr = np.array([[1.0, 0.6, -0.3, 0.0], [0.6, 1.0, 0.0, 0.2], [-0.3, 0.0, 1.0, 0.4], [0.0, 0.2, 0.4, 1.0]])
    return (rng.multivariate_normal([1.0, -1.0, 0.0, 2.0], corr * np.outer(sd, sd), 80),)


# examples/ucbadmit.py's scale_tril = sigma[..., None] * L_Rho, as the covariance of observed vectors
def mvn_lkj(y):
    d = y.shape[1]
    mu = numpyro.sample("mu", dist.Normal(0.0, 10.0).expand([d]).to_event(1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0).expand([d]).to_event(1))
    L_Rho = numpyro.sample("L_Rho", dist.LKJCholesky(d, concentration=2.0))
    scale_tril = sigma[..., jnp.newaxis] * L_Rho
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(mu, scale_tril=scale_tril), obs=y)


EXAMPLES = {
    "baseball_fully_pooled": lambda: Case(baseball_fully_pooled, *_baseball(), "continuous",
                                          "one Uniform(0, 1) probability; integer Binomial total_count"),
    "baseball_not_pooled": lambda: Case(baseball_not_pooled, *_baseball(), "continuous",
                                        "18 independent Uniform(0, 1) latents in the plate; the site returned"),
    "baseball_partially_pooled": lambda: Case(baseball_partially_pooled, *_baseball(), "continuous",
                                              "Pareto(1, 1.5) kappa: support (1, inf), heavy tail; Beta phi"),
    "baseball_logit": lambda: Case(baseball_partially_pooled_logit, *_baseball(), "continuous",
                                   "Binomial(logits) with a centred logit-space hierarchy (HalfCauchy scale)"),
    "bnn": _bnn,
    "horseshoe": lambda: Case(horseshoe_regression, _sparse_data(55, 50, 20), {}, "continuous",
                              "horseshoe, p = 20: HalfCauchy local scales and a shape-(1,) global scale"),
    "regularised_horseshoe": _regularised_horseshoe,
    "holt_winters": _holt_winters,
    "mortality": _mortality,
    "hsgp": _hsgp,
    "mixture_dirichlet": _mixture_dirichlet,
    "zero_inflated_poisson": _zero_inflated_poisson,
    "negative_binomial": _negative_binomial,
    "student_t_regression": _student_t,
    "ordinal_regression": _ordinal,
    "truncated_normal": _truncated_normal,
    "censored_factor": _censored,
    "mvn_lkj": lambda: Case(mvn_lkj, _lkj_mvn_data(), {}, "continuous",
                            "mean, scales and a 4 x 4 LKJCholesky correlation factor"),
    "pumps": _pumps,
    "change_point": _change_point,
    "capture_recapture": _cjs,
    "beta_binomial": _beta_binomial,
    "softmax_regression": _softmax,
    "scale_handler": _weighted_logistic,
    "nested_plates": _crossed,
    "exponential_lognormal": _exponential,
    "uniform_bounds": _uniform_bounds,
    "locscale_plate": _varying_slopes,
    "where_breakpoint": _broken_stick,
    "zero_sum_normal": _zero_sum,
}
