"""Models written by others, first part: the classics and the pitfalls (see
``tests/third_party_models.py``): hierarchical models, ODEs, time series, factor targets,
circular and spherical supports, degenerate shapes, regressions."""


import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from jax.experimental.ode import odeint
from numpyro.contrib.control_flow import scan
from numpyro.distributions import constraints
from numpyro.distributions.transforms import AffineTransform
from numpyro.infer.reparam import (
    CircularReparam,
    LocScaleReparam,
    ProjectedNormalReparam,
    TransformReparam,
)
from third_party_common import Case

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


# notebooks/source/bad_posterior_geometry.ipynb: the centred model under LocScaleReparam(centered=0),
# a handler object rather than a function
eight_schools_locscale = numpyro.handlers.reparam(eight_schools, config={"theta": LocScaleReparam(centered=0)})


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


_EIGHT = (8, EIGHT_SIGMA)
CLASSICS = {
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
}
