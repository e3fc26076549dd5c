"""Reference-posterior suite: small NumPyro models on which Laplace-type approximations can fail.

Each entry returns ``(model, args, kwargs)`` like ``benchmarks/models.py``; the data are
generated with fixed seeds (or typed in) and are float32, NumPyro's default. The models
are written as a NumPyro user would write them (NumPyro's examples, posteriordb); every
one has fewer than 60 unconstrained latent coordinates. Long NUTS runs are the reference
posteriors (``benchmarks/reference.py``); for the three models whose funnels NUTS cannot
cross as written (centred eight schools, the two GPs), NUTS samples the same posterior in
an equivalent non-centred form.
"""

import jax
import jax.numpy as jnp
import numpy as np
import numpyro
import numpyro.distributions as dist
from numpyro.distributions import constraints

import models
from models import rbf_kernel

# Rubin's (1981) eight schools: estimated effects and their standard errors
SCHOOLS_Y = np.array([28.0, 8.0, -3.0, 7.0, -1.0, 1.0, 18.0, 12.0], np.float32)
SCHOOLS_SIGMA = np.array([15.0, 10.0, 16.0, 11.0, 9.0, 11.0, 10.0, 18.0], np.float32)


def eight_schools_centered():
    """Centred eight schools: theta_j ~ Normal(mu, tau). The joint density is unbounded as
    tau -> 0 (the funnel), so there is no useful mode. NUTS on this form diverges too, so
    ``reference.py`` samples the same posterior in the non-centred form (LocScaleReparam)
    with target_accept_prob=0.95."""
    def model(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        with numpyro.plate("J", sigma.shape[0]):
            theta = numpyro.sample("theta", dist.Normal(mu, tau))
            numpyro.sample("obs", dist.Normal(theta, sigma), obs=y)

    return model, (jnp.asarray(SCHOOLS_SIGMA),), {"y": jnp.asarray(SCHOOLS_Y)}


def eight_schools_noncentered():
    """Non-centred eight schools: theta = mu + tau * theta_tilde. Smooth for NUTS, but tau's
    posterior is skewed with its mass piled near zero: a Gaussian in log tau misses it.
    The reference uses target_accept_prob=0.95 (a few divergences at the default 0.8).
    The model and data of ``benchmarks/models.py``."""
    return models.eight_schools()


def eight_schools_noncentered_expand():
    """The non-centred eight schools without a plate: ``expand([8]).to_event(1)`` sites, one
    vector site for the eight effects, as many users write it. Same posterior (and
    reference settings, target_accept_prob=0.95) as above."""
    def model(sigma, y=None):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfCauchy(5.0))
        theta_tilde = numpyro.sample("theta_tilde", dist.Normal(0.0, 1.0).expand([sigma.shape[0]]).to_event(1))
        theta = numpyro.deterministic("theta", mu + tau * theta_tilde)
        numpyro.sample("obs", dist.Normal(theta, sigma).to_event(1), obs=y)

    return model, (jnp.asarray(SCHOOLS_SIGMA),), {"y": jnp.asarray(SCHOOLS_Y)}


def hierarchical_normal_groups(num_groups=10, per_group=5, seed=0):
    """Varying intercepts (centred): 10 groups x 5 observations, unknown group scale tau and
    noise scale sigma. With 5 observations a group, tau is weakly identified and skewed,
    and the intercepts' spread depends on it (a mild funnel)."""
    rng = np.random.default_rng(seed)
    intercepts = 1.0 + 0.7 * rng.standard_normal(num_groups)
    y = (intercepts[:, None] + rng.standard_normal((num_groups, per_group))).astype(np.float32)

    def model(y):
        mu = numpyro.sample("mu", dist.Normal(0.0, 5.0))
        tau = numpyro.sample("tau", dist.HalfNormal(2.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        with numpyro.plate("groups", y.shape[0], dim=-2):
            alpha = numpyro.sample("alpha", dist.Normal(mu, tau))
            with numpyro.plate("obs", y.shape[1], dim=-1):
                numpyro.sample("y", dist.Normal(alpha, sigma), obs=y)

    return model, (jnp.asarray(y),), {}


def beta_binomial_rats(num_groups=20, seed=0):
    """Rats-style hierarchical beta-binomial (Gelman et al., BDA 5.3), 20 generated groups of
    tumour counts: theta_j ~ Beta(phi kappa, (1 - phi) kappa), mean phi ~ Beta(1, 1),
    concentration kappa ~ Pareto(1, 1.5). kappa's posterior has a long right tail, and
    small counts put theta_j near 0."""
    rng = np.random.default_rng(seed)
    n = rng.integers(15, 50, num_groups)
    theta = rng.beta(0.14 * 15.0, 0.86 * 15.0, num_groups)
    y = rng.binomial(n, theta)

    def model(n, y=None):
        phi = numpyro.sample("phi", dist.Beta(1.0, 1.0))
        kappa = numpyro.sample("kappa", dist.Pareto(1.0, 1.5))
        with numpyro.plate("groups", n.shape[0]):
            theta = numpyro.sample("theta", dist.Beta(phi * kappa, (1.0 - phi) * kappa))
            numpyro.sample("y", dist.Binomial(n, theta), obs=y)

    return model, (jnp.asarray(n, jnp.float32),), {"y": jnp.asarray(y, jnp.float32)}


def dirichlet_multinomial(num_groups=8, total=40, seed=0):
    """Hierarchical Dirichlet-multinomial: 8 groups of 40 counts over 4 categories, each
    group's shares p_g ~ Dirichlet(alpha m) with unknown mean shares m ~ Dirichlet(1) and
    concentration alpha ~ Gamma(2, 0.2). Shares near the simplex's edge (a rare category)
    and a skewed, weakly identified alpha that sets every group's spread."""
    rng = np.random.default_rng(seed)
    m_true = np.array([0.45, 0.3, 0.17, 0.08])
    shares = rng.dirichlet(8.0 * m_true, num_groups)
    counts = np.stack([rng.multinomial(total, p) for p in shares]).astype(np.float32)

    def model(counts):
        num_categories = counts.shape[-1]
        m = numpyro.sample("m", dist.Dirichlet(jnp.ones(num_categories)))
        alpha = numpyro.sample("alpha", dist.Gamma(2.0, 0.2))
        with numpyro.plate("groups", counts.shape[0]):
            p = numpyro.sample("p", dist.Dirichlet(alpha * m))
            numpyro.sample("counts", dist.Multinomial(counts.sum(-1), p), obs=counts)

    return model, (jnp.asarray(counts),), {}


def _gp_inputs(n, seed):
    rng = np.random.default_rng(seed)
    return np.sort(rng.uniform(-3.0, 3.0, n)).astype(np.float32), rng


def gp_classification_hyper(n=30, seed=0):
    """Latent GP classification on 30 points in 1-D with unknown RBF lengthscale
    (InverseGamma(5, 5)) and amplitude (LogNormal(0, 1)), f ~ MultivariateNormal (centred).
    Binary labels say little about f, so the amplitude and f form a funnel. NUTS on this
    form diverges, so ``reference.py`` samples the same posterior whitened (f = L z),
    with target_accept_prob=0.95."""
    x, rng = _gp_inputs(n, seed)
    f = 2.0 * np.sin(1.5 * x)
    y = (rng.uniform(size=n) < 1.0 / (1.0 + np.exp(-f))).astype(np.float32)

    def model(x, y=None):
        lengthscale = numpyro.sample("lengthscale", dist.InverseGamma(5.0, 5.0))
        amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
        cov = rbf_kernel(x, lengthscale, amplitude**2, jitter=1e-3)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=cov))
        numpyro.sample("y", dist.Bernoulli(logits=f), obs=y)

    return model, (jnp.asarray(x),), {"y": jnp.asarray(y)}


def gp_poisson_hyper(n=30, seed=1):
    """Latent GP Poisson regression (log link) on 30 counts (true rates 0.37 to 2.7), same
    kernel hyperparameters and priors as ``gp_classification_hyper``. Small counts make the
    log-rates skewed; the hyperparameters couple to all of f. The reference is sampled
    whitened as above, with dense_mass=True and target_accept_prob=0.99."""
    x, rng = _gp_inputs(n, seed)
    y = rng.poisson(np.exp(np.sin(1.2 * x))).astype(np.float32)

    def model(x, y=None):
        lengthscale = numpyro.sample("lengthscale", dist.InverseGamma(5.0, 5.0))
        amplitude = numpyro.sample("amplitude", dist.LogNormal(0.0, 1.0))
        cov = rbf_kernel(x, lengthscale, amplitude**2, jitter=1e-3)
        f = numpyro.sample("f", dist.MultivariateNormal(jnp.zeros(x.shape[0]), covariance_matrix=cov))
        numpyro.sample("y", dist.Poisson(jnp.exp(f)), obs=y)

    return model, (jnp.asarray(x),), {"y": jnp.asarray(y)}


def linear_regression_noise(n=500, d=4, seed=0):
    """Linear regression, N = 500, 4 coefficients, intercept and unknown noise sigma
    (HalfNormal(2)). A nearly Gaussian posterior: the control case Laplace should pass."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d)).astype(np.float32)
    w = np.linspace(1.0, -0.5, d)
    y = (x @ w + 0.5 + 0.8 * rng.standard_normal(n)).astype(np.float32)

    def model(x, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 5.0).expand([x.shape[1]]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 5.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.Normal(x @ w + b, sigma), obs=y)

    return model, (jnp.asarray(x),), {"y": jnp.asarray(y)}


def ar2(num_steps=200, seed=0):
    """AR(2) time series of 200 steps (posteriordb's arK with K = 2): unknown intercept,
    two lag coefficients and noise scale, conditional likelihood with vectorised lags.
    Close to Gaussian; the lag coefficients are strongly correlated."""
    rng = np.random.default_rng(seed)
    y = np.zeros(num_steps + 50)
    for t in range(2, y.size):
        y[t] = 0.3 + 0.6 * y[t - 1] - 0.3 * y[t - 2] + 0.5 * rng.standard_normal()
    y = y[50:].astype(np.float32)

    def model(y):
        c = numpyro.sample("c", dist.Normal(0.0, 2.0))
        phi = numpyro.sample("phi", dist.Normal(0.0, 1.0).expand([2]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        mean = c + phi[0] * y[1:-1] + phi[1] * y[:-2]
        with numpyro.plate("time", y.shape[0] - 2):
            numpyro.sample("y", dist.Normal(mean, sigma), obs=y[2:])

    return model, (jnp.asarray(y),), {}


def garch11(num_steps=200, seed=0):
    """GARCH(1,1) returns (posteriordb's garch11), 200 steps: mean mu, omega > 0,
    alpha1 ~ Uniform(0, 1) and beta1 ~ Uniform(0, 1 - alpha1), the conditional variances
    by ``jax.lax.scan``. Bounded, skewed parameters whose support depends on another
    parameter; omega and beta1 trade off along a curved ridge."""
    rng = np.random.default_rng(seed)
    omega, alpha1, beta1, mu = 0.2, 0.2, 0.7, 0.1
    r = np.zeros(num_steps)
    var = omega / (1.0 - alpha1 - beta1)
    for t in range(num_steps):
        r[t] = mu + np.sqrt(var) * rng.standard_normal()
        var = omega + alpha1 * (r[t] - mu) ** 2 + beta1 * var
    r = r.astype(np.float32)
    sigma1 = np.float32(r.std())

    def model(r, sigma1):
        mu = numpyro.sample("mu", dist.Normal(0.0, 1.0))
        omega = numpyro.sample("omega", dist.HalfNormal(1.0))
        alpha1 = numpyro.sample("alpha1", dist.Uniform(0.0, 1.0))
        beta1 = numpyro.sample("beta1", dist.Uniform(0.0, 1.0 - alpha1))

        def step(var, r_prev):
            var = omega + alpha1 * (r_prev - mu) ** 2 + beta1 * var
            return var, var

        _, var = jax.lax.scan(step, sigma1**2, r[:-1])
        scale = jnp.sqrt(jnp.concatenate([sigma1[None] ** 2, var]))
        with numpyro.plate("time", r.shape[0]):
            numpyro.sample("r", dist.Normal(mu, scale), obs=r)

    return model, (jnp.asarray(r), jnp.asarray(sigma1)), {}


def hmm_two_state(num_steps=150, seed=0):
    """Two-state Poisson HMM, 150 counts from a chain with rates 1 and 6: positive-ordered
    rates (improper flat prior on the ordered pair times a weak Exponential(0.1) factor),
    Dirichlet(1, 1) transition rows, states marginalised by the forward algorithm
    (``jax.lax.scan`` and logsumexp). Bounded transition probabilities near 1."""
    rng = np.random.default_rng(seed)
    stay = np.array([0.9, 0.85])
    states = np.zeros(num_steps, int)
    for t in range(1, num_steps):
        states[t] = states[t - 1] if rng.uniform() < stay[states[t - 1]] else 1 - states[t - 1]
    y = rng.poisson(np.array([1.0, 6.0])[states]).astype(np.float32)

    def model(y):
        rates = numpyro.sample("rates", dist.ImproperUniform(constraints.positive_ordered_vector, (), (2,)))
        numpyro.factor("rates_prior", dist.Exponential(0.1).log_prob(rates).sum())
        with numpyro.plate("state", 2):
            trans = numpyro.sample("trans", dist.Dirichlet(jnp.ones(2)))
        log_trans = jnp.log(trans)
        log_emit = dist.Poisson(rates).log_prob(y[:, None])  # (T, 2)

        def forward(log_alpha, log_e):
            log_alpha = jax.nn.logsumexp(log_alpha[:, None] + log_trans, axis=0) + log_e
            return log_alpha, None

        log_alpha, _ = jax.lax.scan(forward, jnp.log(0.5) + log_emit[0], log_emit[1:])
        numpyro.factor("y", jax.nn.logsumexp(log_alpha))

    return model, (jnp.asarray(y),), {}


def student_t_regression(n=100, seed=0):
    """Robust regression: Student-t likelihood with unknown df nu ~ Gamma(2, 0.1), scale and
    coefficients, 100 points of which 5 are gross outliers. nu's posterior is wide and
    skewed, and the outliers make the likelihood non-log-concave."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, 2)).astype(np.float32)
    y = 1.0 + x @ np.array([2.0, -1.0]) + 0.5 * rng.standard_normal(n)
    y[rng.choice(n, 5, replace=False)] += rng.choice([-1.0, 1.0], 5) * rng.uniform(5.0, 10.0, 5)
    y = y.astype(np.float32)

    def model(x, y=None):
        w = numpyro.sample("w", dist.Normal(0.0, 10.0).expand([x.shape[1]]).to_event(1))
        b = numpyro.sample("b", dist.Normal(0.0, 10.0))
        sigma = numpyro.sample("sigma", dist.HalfNormal(2.0))
        nu = numpyro.sample("nu", dist.Gamma(2.0, 0.1))
        with numpyro.plate("data", x.shape[0]):
            numpyro.sample("y", dist.StudentT(nu, x @ w + b, sigma), obs=y)

    return model, (jnp.asarray(x),), {"y": jnp.asarray(y)}


def lkj_covariance(n=50, seed=0):
    """Trivariate Normal data (50 points) with unknown means, scales (HalfCauchy(2.5)) and
    correlation Cholesky factor ~ LKJCholesky(3, 2), ``scale_tril = sigma * L``. Bounded,
    curved correlation coordinates."""
    rng = np.random.default_rng(seed)
    corr = np.array([[1.0, 0.6, -0.3], [0.6, 1.0, 0.2], [-0.3, 0.2, 1.0]])
    sd = np.array([1.0, 2.0, 0.5])
    y = rng.multivariate_normal(np.array([0.0, 1.0, -1.0]), corr * np.outer(sd, sd), n).astype(np.float32)

    def model(y):
        d = y.shape[1]
        mu = numpyro.sample("mu", dist.Normal(0.0, 10.0).expand([d]).to_event(1))
        sigma = numpyro.sample("sigma", dist.HalfCauchy(2.5).expand([d]).to_event(1))
        L_omega = numpyro.sample("L_omega", dist.LKJCholesky(d, concentration=2.0))
        scale_tril = sigma[:, None] * L_omega
        with numpyro.plate("data", y.shape[0]):
            numpyro.sample("y", dist.MultivariateNormal(mu, scale_tril=scale_tril), obs=y)

    return model, (jnp.asarray(y),), {}


SUITE = {
    "eight_schools_centered": eight_schools_centered,
    "eight_schools_noncentered": eight_schools_noncentered,
    "eight_schools_noncentered_expand": eight_schools_noncentered_expand,
    "hierarchical_normal_groups": hierarchical_normal_groups,
    "beta_binomial_rats": beta_binomial_rats,
    "dirichlet_multinomial": dirichlet_multinomial,
    "gp_classification_hyper": gp_classification_hyper,
    "gp_poisson_hyper": gp_poisson_hyper,
    "linear_regression_noise": linear_regression_noise,
    "ar2": ar2,
    "garch11": garch11,
    "hmm_two_state": hmm_two_state,
    "student_t_regression": student_t_regression,
    "lkj_covariance": lkj_covariance,
}
