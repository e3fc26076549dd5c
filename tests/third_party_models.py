"""Models written by others: the robustness corpus of issue 17.

Small NumPyro models written the way third-party users write them, each imitating one of
NumPyro's own examples, tests or notebooks (cited in a comment above the model). They
exercise what a Laplace library meets in the wild rather than what its own tests construct:
plate sizes computed in Python from data arguments (`int(n)`, `np.max`, `np.unique`),
closures over global data, callable objects, handler-wrapped models, `numpyro.factor`
targets, circular and spherical supports, missing data through `obs_mask`, zero-size and
zero-dimensional sites, discrete latents, `numpyro.param` sites, subsampling, `scan` and ODEs.
A second batch adds the rest of the examples' repertoire: ordered, zero-sum, Pareto and
dependent-interval supports, `handlers.scale` weights, `scope`d site names, plates at dims
-3 to -1, hand-marginalised likelihoods, truncation and censoring, and `jnp.where` on latents.

Every case is small (a few to ~200 latent numbers, at most a few hundred data points) and its
data come from numpy with a fixed seed. Data are numpy arrays, as users pass them.
`case(name)` returns a `Case`; `CASES` maps every name to its case.
"""

from collections.abc import Callable
from functools import cache
from typing import NamedTuple

import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.experimental.ode import odeint
from jax.scipy.special import expit
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform
from numpyro.infer.reparam import (
    CircularReparam,
    LocScaleReparam,
    ProjectedNormalReparam,
    TransformReparam,
)


class Case(NamedTuple):
    model: Callable
    args: tuple
    kwargs: dict  # observed data passed as keyword, as users do
    kind: str  # "continuous", "discrete", "circular", "no_latent" or "degenerate"
    note: str  # the pitfall the case exercises


# ---------------------------------------------------------------- hierarchical classics

EIGHT_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0])
EIGHT_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0])


# NumPyro README, "eight_schools" (centred)
def eight_schools(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


# NumPyro README, "eight_schools_noncentered" (TransformReparam of an affine-transformed Normal)
def eight_schools_noncentered(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        with numpyro.handlers.reparam(config={"theta": TransformReparam()}):
            theta = numpyro.sample(
                "theta",
                dist.TransformedDistribution(dist.Normal(0.0, 1.0), AffineTransform(mu, tau)),
            )
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


# notebooks/source/bad_posterior_geometry.ipynb: LocScaleReparam(centered=0) as a decorator
@numpyro.handlers.reparam(config={"theta": LocScaleReparam(centered=0)})
def eight_schools_locscale(J, sigma, y=None):
    mu = numpyro.sample("mu", dist.Normal(0, 5))
    tau = numpyro.sample("tau", dist.HalfCauchy(5))
    with numpyro.plate("J", J):
        theta = numpyro.sample("theta", dist.Normal(mu, tau))
        numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)


# examples/funnel.py (centred Neal's funnel, no data)
def funnel(dim=10):
    y = numpyro.sample("y", dist.Normal(0, 3))
    numpyro.sample("x", dist.Normal(jnp.zeros(dim - 1), jnp.exp(y / 2)))


# examples/ucbadmit.py (glmm), with the department count taken from the data by numpy
def ucb_glmm(dept, male, applications, admit=None):
    v_mu = numpyro.sample("v_mu", dist.Normal(0, jnp.array([4.0, 1.0])))
    sigma = numpyro.sample("sigma", dist.HalfNormal(jnp.ones(2)))
    L_Rho = numpyro.sample("L_Rho", dist.LKJCholesky(2, concentration=2))
    scale_tril = sigma[..., jnp.newaxis] * L_Rho
    num_dept = np.max(dept) + 1  # a plate size that must stay a concrete number
    z = numpyro.sample("z", dist.Normal(jnp.zeros((num_dept, 2)), 1))
    v = jnp.dot(scale_tril, z.T).T
    logits = v_mu[0] + v[dept, 0] + (v_mu[1] + v[dept, 1]) * male
    numpyro.sample("admit", dist.Binomial(applications, logits=logits), obs=admit)


def _ucb_admissions():
    dept = np.repeat(np.arange(6), 2)
    male = np.tile([1, 0], 6)
    applications = np.array([825, 108, 560, 25, 325, 593, 417, 375, 191, 393, 373, 341])
    admit = np.array([512, 89, 353, 17, 120, 202, 138, 131, 53, 94, 22, 24])
    return Case(ucb_glmm, (dept, male, applications), {"admit": admit}, "continuous",
                "plate size np.max(dept) + 1 computed from a numpy data argument; LKJCholesky")


# examples/baseball.py partial pooling, with the group count passed in as a numpy integer
def varying_intercepts(num_groups, group, y=None):
    num_groups = int(num_groups)  # fails if the library hands the model traced arguments
    mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
    tau = numpyro.sample("tau", dist.HalfNormal(2.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("groups", num_groups):
        alpha = numpyro.sample("alpha", dist.Normal(mu, tau))
    with numpyro.plate("obs", len(group)):
        numpyro.sample("y", dist.Normal(alpha[group], sigma), obs=y)


def _int_arg():
    rng = np.random.default_rng(5)
    group = rng.integers(0, 5, 60)
    y = rng.normal(1.0 + rng.normal(0.0, 0.8, 5)[group], 1.0)
    return Case(varying_intercepts, (np.int64(5), group), {"y": y}, "continuous",
                "calls int() on a numpy-integer argument to size a plate")


# notebooks/source/bayesian_hierarchical_linear_regression.ipynb (OSIC: Greek site names too)
def partial_pooling(patient_code, Weeks, FVC_obs=None):
    μ_α = numpyro.sample("μ_α", dist.Normal(0.0, 500.0))
    σ_α = numpyro.sample("σ_α", dist.HalfNormal(100.0))
    μ_β = numpyro.sample("μ_β", dist.Normal(0.0, 3.0))
    σ_β = numpyro.sample("σ_β", dist.HalfNormal(3.0))
    n_patients = len(np.unique(patient_code))
    with numpyro.plate("plate_i", n_patients):
        α = numpyro.sample("α", dist.Normal(μ_α, σ_α))
        β = numpyro.sample("β", dist.Normal(μ_β, σ_β))
    σ = numpyro.sample("σ", dist.HalfNormal(100.0))
    FVC_est = α[patient_code] + β[patient_code] * Weeks
    with numpyro.plate("data", len(patient_code)):
        numpyro.sample("obs", dist.Normal(FVC_est, σ), obs=FVC_obs)


def _unique_codes():
    rng = np.random.default_rng(6)
    patient_code = np.repeat(np.arange(8), 6)
    weeks = np.tile(np.arange(0.0, 60.0, 10.0), 8)
    fvc = rng.normal(2500.0, 400.0, 8)[patient_code] - 5.0 * weeks + rng.normal(0, 100, 48)
    return Case(partial_pooling, (patient_code, weeks), {"FVC_obs": fvc}, "continuous",
                "plate size len(np.unique(data)); non-ASCII site names; scales in the hundreds")


# ---------------------------------------------------------------- ODE, time series, GP

def dz_dt(z, t, theta):
    u, v = z[0], z[1]
    alpha, beta, gamma, delta = theta[0], theta[1], theta[2], theta[3]
    return jnp.stack([(alpha - beta * v) * u, (-gamma + delta * u) * v])


# examples/ode.py (Lotka-Volterra), shortened to 10 yearly points
def lotka_volterra(N, y=None):
    z_init = numpyro.sample("z_init", dist.LogNormal(jnp.log(10), 1).expand([2]))
    ts = jnp.arange(float(N))
    theta = numpyro.sample(
        "theta",
        dist.TruncatedNormal(low=0.0, loc=jnp.array([1.0, 0.05, 1.0, 0.05]),
                             scale=jnp.array([0.5, 0.05, 0.5, 0.05])),
    )
    z = odeint(dz_dt, z_init, ts, theta, rtol=1e-6, atol=1e-5, mxstep=1000)
    sigma = numpyro.sample("sigma", dist.LogNormal(-1, 1).expand([2]))
    numpyro.sample("y", dist.LogNormal(jnp.log(z), sigma), obs=y)


def _lotka_volterra():
    rng = np.random.default_rng(7)
    theta, z, dt = np.array([0.55, 0.028, 0.84, 0.024]), np.array([33.0, 6.0]), 0.01

    def rate(z):
        return np.array([(theta[0] - theta[1] * z[1]) * z[0], (-theta[2] + theta[3] * z[0]) * z[1]])

    path = [z]
    for _ in range(9 * 100):  # RK4 to t = 9, keeping whole years
        k1 = rate(z)
        k2 = rate(z + dt / 2 * k1)
        k3 = rate(z + dt / 2 * k2)
        z = z + dt / 6 * (k1 + 2 * k2 + 2 * k3 + rate(z + dt * k3))
        path.append(z)
    y = np.array(path[::100]) * np.exp(rng.normal(0.0, 0.2, (10, 2)))
    return Case(lotka_volterra, (10,), {"y": y}, "continuous",
                "jax.experimental.ode.odeint in the likelihood; TruncatedNormal; float(N)")


# examples/ar2.py (scan under condition), reduced to AR(1)
def ar1(y):
    phi = numpyro.sample("phi", dist.Normal(0, 1))
    const = numpyro.sample("const", dist.Normal(0, 1))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1))

    def transition(y_prev, _):
        y_t = numpyro.sample("y", dist.Normal(const + phi * y_prev, sigma))
        return y_t, None

    y = jnp.asarray(y)  # scan indexes the conditioned values with a tracer: numpy cannot
    with numpyro.handlers.condition(data={"y": y[1:]}):
        scan(transition, y[0], jnp.arange(len(y) - 1))


def _ar1():
    rng = np.random.default_rng(8)
    y = np.zeros(60)
    for t in range(1, 60):
        y[t] = 0.3 + 0.7 * y[t - 1] + rng.normal(0.0, 0.5)
    return Case(ar1, (y,), {}, "continuous",
                "observations enter through handlers.condition around contrib scan")


# examples/stochastic_volatility.py, 50 steps
def stochastic_volatility(returns):
    step_size = numpyro.sample("sigma", dist.Exponential(50.0))
    s = numpyro.sample("s", dist.GaussianRandomWalk(scale=step_size, num_steps=jnp.shape(returns)[0]))
    nu = numpyro.sample("nu", dist.Exponential(0.1))
    return numpyro.sample("r", dist.StudentT(df=nu, loc=0.0, scale=jnp.exp(s)), obs=returns)


def _stochastic_volatility():
    rng = np.random.default_rng(9)
    s = -4.0 + np.cumsum(rng.normal(0.0, 0.05, 50))
    return Case(stochastic_volatility, (np.exp(s) * rng.standard_t(5.0, 50),), {}, "continuous",
                "GaussianRandomWalk latent with a scale whose prior mass sits near 0 (funnel)")


# examples/gp.py (RBF kernel, LogNormal(0, 10) hyperpriors), N = 30
def gp(X, Y):
    var = numpyro.sample("kernel_var", dist.LogNormal(0.0, 10.0))
    noise = numpyro.sample("kernel_noise", dist.LogNormal(0.0, 10.0))
    length = numpyro.sample("kernel_length", dist.LogNormal(0.0, 10.0))
    k = var * jnp.exp(-0.5 * ((X[:, None] - X) / length) ** 2) + (noise + 1e-6) * jnp.eye(X.shape[0])
    numpyro.sample("Y", dist.MultivariateNormal(jnp.zeros(X.shape[0]), covariance_matrix=k), obs=Y)


def _gp_regression():
    rng = np.random.default_rng(10)
    X = np.linspace(-1, 1, 30)
    Y = X + 0.2 * X**3 + 0.5 * (0.5 + X) ** 2 * np.sin(4.0 * X) + 0.15 * rng.normal(size=30)
    return Case(gp, (X, (Y - Y.mean()) / Y.std()), {}, "continuous",
                "hyperparameters only; Cholesky inside the likelihood; very wide LogNormal priors")


# ---------------------------------------------------------------- factor targets, mixtures

# notebooks/source/gmm.ipynb, marginalised: MixtureSameFamily with equal weights
def mixture_marginal(y):
    locs = numpyro.sample("locs", dist.Normal(0.0, 10.0).expand([2]).to_event(1))
    mix = dist.MixtureSameFamily(dist.Categorical(probs=jnp.array([0.5, 0.5])), dist.Normal(locs, 1.0))
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", mix, obs=y)


def _mixture_marginal():
    x = np.random.default_rng(11).normal(2.0, 1.0, 50)
    return Case(mixture_marginal, (np.concatenate([x, -x]),), {}, "continuous",
                "label switching; data symmetric about 0 so locs = (0, 0) is an exact saddle")


# examples/neutra.py pattern: a target defined through numpyro.factor
def double_well():
    x = numpyro.sample("x", dist.Normal(0.0, 10.0))
    numpyro.factor("potential", -4.0 * (x**2 - 1.0) ** 2)


def banana():
    x = numpyro.sample("x", dist.Normal(0.0, 10.0))
    y = numpyro.sample("y", dist.Normal(0.0, 10.0))
    numpyro.factor("rosenbrock", -0.5 * ((1.0 - x) ** 2 + 10.0 * (y - x**2) ** 2))


# ---------------------------------------------------------------- circular and spherical

# test/infer/test_reparam.py::test_circular, with a location to infer from data near pi
def von_mises(angles):
    mu = numpyro.sample("mu", dist.VonMises(0.0, 0.5))
    kappa = numpyro.sample("kappa", dist.LogNormal(1.0, 1.0))
    with numpyro.plate("data", len(angles)):
        numpyro.sample("obs", dist.VonMises(mu, kappa), obs=angles)


# same model, decorated the way test_circular does it
von_mises_circular = numpyro.handlers.reparam(von_mises, config={"mu": CircularReparam()})


def _angles():
    return (np.random.default_rng(12).vonmises(np.pi, 4.0, 30),)


# test/infer/test_reparam.py::test_projected_normal, a latent direction seen through noisy points
def projected_normal(points):
    direction = numpyro.sample("direction", dist.ProjectedNormal(jnp.zeros(3)))
    with numpyro.plate("data", len(points)):
        numpyro.sample("points", dist.Normal(direction, 0.3).to_event(1), obs=points)


projected_normal_reparam = numpyro.handlers.reparam(
    projected_normal, config={"direction": ProjectedNormalReparam()}
)


def _points():
    rng = np.random.default_rng(13)
    return (np.array([0.6, 0.0, 0.8]) + 0.3 * rng.normal(size=(25, 3)),)


# ---------------------------------------------------------------- degenerate shapes

# notebooks/source/bayesian_imputation.ipynb: missing values through obs_mask
def regression_missing(x, y, y_mask):
    a = numpyro.sample("a", dist.Normal(0.0, 5.0))
    b = numpyro.sample("b", dist.Normal(0.0, 5.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
    with numpyro.plate("data", len(x)):
        numpyro.sample("y", dist.Normal(a + b * x, sigma), obs=y, obs_mask=y_mask)


def _obs_mask():
    rng = np.random.default_rng(14)
    x = rng.normal(size=40)
    y = 1.0 + 2.0 * x + rng.normal(0.0, 0.5, 40)
    y[rng.choice(40, 6, replace=False)] = np.nan
    return Case(regression_missing, (x, y, ~np.isnan(y)), {}, "degenerate",
                "latent y_unobserved has all 40 entries; the 34 observed ones carry no density")


# no NumPyro original: effects for zero groups, as when a data-frame filter leaves none.
# numpyro.plate itself asserts a positive size, so the empty site is an expanded Normal.
def zero_size(y):
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
    z = numpyro.sample("z", dist.Normal(0.0, 1.0).expand([0]).to_event(1))
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", dist.Normal(mu + z.sum(), sigma), obs=y)


# test/infer/test_mcmc.py::test_trivial_dirichlet, next to an ordinary site
def simplex_one(y):
    p = numpyro.sample("p", dist.Dirichlet(jnp.ones(1)))  # always [1.0]: zero free dimensions
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", dist.Normal(mu * p[0], 1.0), obs=y)


def _normal_data():
    return (np.random.default_rng(15).normal(0.5, 1.0, 20),)


# only observed sites: nothing to infer
def no_latent(y):
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", dist.Normal(0.0, 1.0), obs=y)


# notebooks/source/gmm.ipynb without config_enumerate: per-point assignments left discrete
def gmm_assignments(y):
    weights = numpyro.sample("weights", dist.Dirichlet(jnp.ones(2)))
    with numpyro.plate("components", 2):
        locs = numpyro.sample("locs", dist.Normal(0.0, 5.0))
    with numpyro.plate("data", len(y)):
        z = numpyro.sample("z", dist.Categorical(weights))
        numpyro.sample("y", dist.Normal(locs[z], 1.0), obs=y)


def _discrete_latent():
    rng = np.random.default_rng(16)
    y = np.concatenate([rng.normal(-2.0, 1.0, 8), rng.normal(2.0, 1.0, 12)])
    return Case(gmm_assignments, (y,), {}, "discrete",
                "latent Categorical per data point, not enumerated")


# ---------------------------------------------------------------- regressions

def _logistic_regression():
    rng = np.random.default_rng(17)
    data = rng.normal(size=(100, 3))
    labels = (rng.random(100) < 1 / (1 + np.exp(-data @ np.array([1.0, -0.5, 0.25])))).astype(float)

    # test/infer/test_mcmc.py::test_logistic_regression: the features are a closure, not an argument
    def model(labels):
        coefs = numpyro.sample("coefs", dist.Normal(jnp.zeros(3), jnp.ones(3)))
        logits = jnp.sum(coefs * data, axis=-1)
        return numpyro.sample("obs", dist.Bernoulli(logits=logits), obs=labels)

    return Case(model, (labels,), {}, "continuous",
                "design matrix captured by closure; vector site without a plate")


# examples/baseball.py-style count GLM (Binomial there), here Poisson with a log-exposure offset
def poisson_regression(x, exposure, counts=None):
    intercept = numpyro.sample("intercept", dist.Normal(0.0, 2.0))
    slope = numpyro.sample("slope", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", len(x)):
        rate = jnp.exp(intercept + slope * x + jnp.log(exposure))
        numpyro.sample("counts", dist.Poisson(rate), obs=counts)


def _poisson_regression():
    rng = np.random.default_rng(18)
    x, exposure = rng.normal(size=80), rng.uniform(1.0, 5.0, 80)
    counts = rng.poisson(np.exp(0.2 + 0.6 * x) * exposure)
    return Case(poisson_regression, (x, exposure), {"counts": counts}, "continuous",
                "integer numpy observations; offset")


# examples/hmcecs.py: a plate with subsample_size and numpyro.subsample, plus group intercepts
def hierarchical_logistic(num_groups, group, features, labels=None, subsample_size=50):
    mu = numpyro.sample("mu", dist.Normal(0.0, 2.0))
    tau = numpyro.sample("tau", dist.HalfNormal(1.0))
    with numpyro.plate("groups", num_groups):
        alpha = numpyro.sample("alpha", dist.Normal(mu, tau))
    beta = numpyro.sample("beta", dist.Normal(jnp.zeros(features.shape[1]), 1.0).to_event(1))
    with numpyro.plate("N", len(group), subsample_size=subsample_size):
        batch_group = numpyro.subsample(jnp.asarray(group), event_dim=0)
        batch_feats = numpyro.subsample(jnp.asarray(features), event_dim=1)
        batch_obs = None if labels is None else numpyro.subsample(jnp.asarray(labels), event_dim=0)
        logits = alpha[batch_group] + batch_feats @ beta
        numpyro.sample("obs", dist.Bernoulli(logits=logits), obs=batch_obs)


def _subsample():
    rng = np.random.default_rng(19)
    group, features = rng.integers(0, 4, 200), rng.normal(size=(200, 2))
    logits = rng.normal(0.0, 1.0, 4)[group] + features @ np.array([0.8, -0.4])
    labels = (rng.random(200) < 1 / (1 + np.exp(-logits))).astype(float)
    return Case(hierarchical_logistic, (4, group, features), {"labels": labels}, "continuous",
                "plate subsample_size=50 of 200: random log density; NUTS refuses it")


# test/infer/test_reparam.py::dirichlet_categorical
def dirichlet_categorical(data):
    concentration = jnp.array([1.0, 1.0, 1.0, 1.0])
    p_latent = numpyro.sample("p", dist.Dirichlet(concentration))
    with numpyro.plate("N", data.shape[0]):
        numpyro.sample("obs", dist.Categorical(p_latent), obs=data)
    return p_latent


# docstring example of dist.LKJCholesky (numpyro/distributions/continuous.py)
def lkj_cholesky(y):
    d, N = y.shape[1], y.shape[0]
    theta = numpyro.sample("theta", dist.HalfCauchy(jnp.ones(d)))
    L_omega = numpyro.sample("L_omega", dist.LKJCholesky(d, jnp.ones(1)))
    L_Omega = jnp.matmul(jnp.diag(jnp.sqrt(theta)), L_omega)
    with numpyro.plate("observations", N):
        numpyro.sample("obs", dist.MultivariateNormal(jnp.zeros(d), scale_tril=L_Omega), obs=y)


def _lkj():
    rng = np.random.default_rng(21)
    cov = np.array([[1.0, 0.5, 0.2], [0.5, 2.0, -0.3], [0.2, -0.3, 0.5]])
    return Case(lkj_cholesky, (rng.multivariate_normal(np.zeros(3), cov, 100),), {}, "continuous",
                "corr_cholesky support; shape-(1,) concentration makes L_omega (1, 3, 3)")


# test/test_distributions.py Wishart cases: a Wishart precision matrix for bivariate data
def wishart_precision(y):
    mu = numpyro.sample("mu", dist.Normal(jnp.zeros(2), 5.0).to_event(1))
    precision = numpyro.sample("precision", dist.Wishart(4.0, scale_matrix=jnp.eye(2)))
    with numpyro.plate("data", y.shape[0]):
        numpyro.sample("y", dist.MultivariateNormal(mu, precision_matrix=precision), obs=y)


# notebooks/source/bayesian_regression.ipynb (divorce model): optional keyword data, deterministic mu
def divorce_regression(marriage=None, age=None, divorce=None):
    a = numpyro.sample("a", dist.Normal(0.0, 0.2))
    M, A = 0.0, 0.0
    if marriage is not None:
        bM = numpyro.sample("bM", dist.Normal(0.0, 0.5))
        M = bM * marriage
    if age is not None:
        bA = numpyro.sample("bA", dist.Normal(0.0, 0.5))
        A = bA * age
    sigma = numpyro.sample("sigma", dist.Exponential(1.0))
    mu = numpyro.deterministic("mu", a + M + A)
    numpyro.sample("obs", dist.Normal(mu, sigma), obs=divorce)


def _deterministic():
    rng = np.random.default_rng(22)
    marriage, age = rng.normal(size=50), rng.normal(size=50)
    divorce = 0.1 * marriage - 0.6 * age + rng.normal(0.0, 0.7, 50)
    return Case(divorce_regression, (), {"marriage": marriage, "age": age, "divorce": divorce},
                "continuous", "all data by keyword; structure depends on which are None; deterministic")


# Statistical Rethinking NumPyro port (ch. 7): numpyro.param inside the model itself
def with_param(y):
    offset = numpyro.param("offset", 0.5)
    scale = numpyro.param("scale", 1.0, constraint=constraints.positive)
    mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
    with numpyro.plate("data", len(y)):
        numpyro.sample("y", dist.Normal(mu + offset, scale), obs=y)


# a model object the way users bundle hyperparameters (cf. test_mcmc.py linear regression)
class LinearRegression:
    def __init__(self, prior_scale=1.0):
        self.prior_scale = prior_scale

    def __call__(self, x, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, self.prior_scale))
        b = numpyro.sample("b", dist.Normal(0.0, self.prior_scale))
        sigma = numpyro.sample("sigma", dist.HalfNormal(1.0))
        with numpyro.plate("data", len(x)):
            numpyro.sample("y", dist.Normal(w * x + b, sigma), obs=y)


def _class_model():
    rng = np.random.default_rng(23)
    x = rng.normal(size=40)
    return Case(LinearRegression(prior_scale=2.0), (x,), {"y": 0.5 - 1.5 * x + rng.normal(0, 0.3, 40)},
                "continuous", "the model is an instance with __call__, not a function")


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


# ---------------------------------------------------------------- registry

_EIGHT = (8, EIGHT_SIGMA)
_BUILDERS = {
    "eight_schools_centred": lambda: Case(eight_schools, _EIGHT, {"y": EIGHT_Y}, "continuous",
                                          "centred hierarchy: funnel between tau and theta"),
    "eight_schools_noncentred": lambda: Case(eight_schools_noncentered, _EIGHT, {"y": EIGHT_Y}, "continuous",
                                             "TransformReparam: theta_base latent, theta deterministic"),
    "eight_schools_locscale": lambda: Case(eight_schools_locscale, _EIGHT, {"y": EIGHT_Y}, "continuous",
                                           "model wrapped by a reparam handler decorator (not a function)"),
    "funnel": lambda: Case(funnel, (10,), {}, "continuous",
                           "no data; density unbounded as y -> -inf, so no finite mode"),
    "ucb_admissions": _ucb_admissions,
    "int_arg": _int_arg,
    "unique_codes": _unique_codes,
    "lotka_volterra": _lotka_volterra,
    "ar1_scan": _ar1,
    "stochastic_volatility": _stochastic_volatility,
    "gp_regression": _gp_regression,
    "mixture_marginal": _mixture_marginal,
    "double_well": lambda: Case(double_well, (), {}, "continuous",
                                "factor only; modes at +-1 and a local minimum of density at 0"),
    "banana": lambda: Case(banana, (), {}, "continuous", "Rosenbrock-shaped factor target, curved ridge"),
    "von_mises": lambda: Case(von_mises, _angles(), {}, "circular",
                              "VonMises location with data near pi: the mode sits on the +-pi cut"),
    "von_mises_circular": lambda: Case(von_mises_circular, _angles(), {}, "continuous",
                                       "CircularReparam: ImproperUniform latent (prior draws raise), periodic posterior"),
    "projected_normal": lambda: Case(projected_normal, _points(), {}, "circular",
                                     "sphere support has no bijection to R^n"),
    "projected_normal_reparam": lambda: Case(projected_normal_reparam, _points(), {}, "continuous",
                                             "ProjectedNormalReparam: radius is a prior-only direction"),
    "obs_mask": _obs_mask,
    "zero_size": lambda: Case(zero_size, _normal_data(), {}, "degenerate",
                              "latent of shape (0,) (zero groups) next to normal sites"),
    "simplex_one": lambda: Case(simplex_one, _normal_data(), {}, "degenerate",
                                "Dirichlet with one category: zero unconstrained dimensions"),
    "no_latent": lambda: Case(no_latent, _normal_data(), {}, "no_latent", "only observed sites"),
    "discrete_latent": _discrete_latent,
    "logistic_regression": _logistic_regression,
    "poisson_regression": _poisson_regression,
    "subsample_logistic": _subsample,
    "dirichlet_categorical": lambda: Case(
        dirichlet_categorical, (np.random.default_rng(20).choice(4, 200, p=[0.1, 0.5, 0.3, 0.1]),), {},
        "continuous", "simplex latent; integer Categorical observations"),
    "lkj_cholesky": _lkj,
    "wishart": lambda: Case(
        wishart_precision, (np.random.default_rng(24).multivariate_normal([1, -1], [[1, 0.6], [0.6, 2]], 60),),
        {}, "continuous", "positive-definite matrix latent (Wishart precision)"),
    "deterministic_sites": _deterministic,
    "param_site": lambda: Case(with_param, _normal_data(), {}, "continuous",
                               "numpyro.param sites in the model: refuse, or hold at their init values"),
    "class_model": _class_model,
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
NAMES = tuple(_BUILDERS)


@cache
def case(name) -> Case:
    return _BUILDERS[name]()


CASES: dict[str, Case] = {name: case(name) for name in NAMES}
