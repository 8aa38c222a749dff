// SPDX-License-Identifier: GPL-2.0
/*
 * User-space unit test of module/kbp_netap.c, the NetAP golden-section
 * search of the polling interval.  Built and run by
 * tests/module/test_netap_search.py:
 *
 *   gcc -Wall -Wextra -Werror -O2 -Imodule tests/module/netap/netap_test.c \
 *       module/kbp_netap.c -o netap_test && ./netap_test
 *
 * The "workload" is a synthetic unimodal curve: bytes per round as a
 * function of the polling interval, optionally with +-1 % noise from a
 * deterministic LCG.  Exit status 0 when every check passed; each failed
 * check prints a FAIL line.  A table of the rounds each search took and
 * where it ended is printed either way.
 *
 * "Rounds to converge" counts the calls of kbp_netap_round() until
 * s.converged is set: the measured rounds (round 0 runs in kbp_netap_init()
 * and measures nothing).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kbp_netap.h"

#define PEAK_TOL_US	(2 * KBP_NETAP_MIN_DISTANCE_US)
#define MAX_ROUNDS	12
#define HEIGHT		1e9	/* bytes per round at the peak */
#define NOISY_RATIO	0.95

static int failures;
static int checks;

#define CHECK(cond, ...) do {						\
	checks++;							\
	if (!(cond)) {							\
		failures++;						\
		printf("FAIL %s:%d: ", __FILE__, __LINE__);		\
		printf(__VA_ARGS__);					\
		printf("\n");						\
	}								\
} while (0)

enum shape {
	/* steep enough that +-1 % noise cannot hide 60 us */
	TENT,		/* exp(-d / 1000): 5.8 % down at 60 us, and per 60 us */
	ASYM,		/* gentle below the peak, steep above (ring overflow) */
	PEAKY,		/* 1 / (1 + d / 300) */
	FLAT,		/* plateau of +-plateau us, then as TENT */
	/* gentle: +-1 % noise hides the peak's neighbours */
	GENTLE,		/* linear, 1.2 % down at 60 us */
	SHALLOW,	/* paper-like, 10 % down at 1000 us */
	PARABOLA,	/* smooth top, 0.06 % down at 60 us */
	/* informational only under noise, see test_noisy() */
	SPIKE,		/* 20 % down at 200 us, then 1 % per 100 us */
};

static const char * const shape_name[] = {
	"tent", "asym", "peaky", "flat", "gentle", "shallow", "parabola",
	"spike",
};

struct curve {
	enum shape shape;
	double peak;		/* us */
	double plateau;		/* FLAT: half width, us */
	double height;
};

/*
 * Down by @slope per us for @knee us, then by 0.0001 per us: steep near the
 * peak, and still strictly decreasing 4000 us away (a curve that runs into
 * a floor is not unimodal there, and no search can climb it).
 */
static double kinked(double d, double slope, double knee)
{
	return d <= knee ? 1 - d * slope : 1 - knee * slope - (d - knee) * 0.0001;
}

static double curve_f(const struct curve *c, double x)
{
	double d = fabs(x - c->peak), v;

	switch (c->shape) {
	case TENT:
		v = exp(-d / 1000);
		break;
	case SPIKE:
		v = kinked(d, 0.001, 200);
		break;
	case ASYM:
		v = x < c->peak ? kinked(d, 0.0007, 300) : 1 / (1 + d / 100);
		break;
	case PEAKY:
		v = 1 / (1 + d / 300);
		break;
	case FLAT:
		v = d <= c->plateau ? 1 : kinked(d - c->plateau, 0.001, 200);
		break;
	case GENTLE:
		v = 1 - d * 0.0002;
		break;
	case SHALLOW:
		v = 1 - d * 0.0001;
		break;
	case PARABOLA:
	default:
		v = 1 - (d / 2500) * (d / 2500);
		break;
	}
	if (v < 0.05)
		v = 0.05;
	return v * c->height;
}

/* distance from x to the curve's peak (its plateau for FLAT) */
static double peak_dist(const struct curve *c, double x)
{
	double d = fabs(x - c->peak);

	if (c->shape == FLAT)
		d = d > c->plateau ? d - c->plateau : 0;
	return d;
}

/* the curve's best value inside [lo, hi] and where it is */
static double peak_in(const struct curve *c, u32 lo, u32 hi, u32 *at)
{
	double best = -1;
	u32 x;

	for (x = lo; x <= hi; x++) {
		if (curve_f(c, x) > best) {
			best = curve_f(c, x);
			*at = x;
		}
	}
	return best;
}

static u64 lcg_state;

static u64 lcg(void)
{
	lcg_state = lcg_state * 6364136223846793005ULL + 1442695040888963407ULL;
	return lcg_state >> 11;
}

/* bytes of one round at @x: the curve, times 1 +- @noise_pct % */
static u64 measure(const struct curve *c, u32 x, double noise_pct)
{
	double v = curve_f(c, x);

	if (noise_pct > 0)
		v *= 1 + noise_pct / 100 * ((double)(lcg() % 20001) / 10000 - 1);
	return (u64)v;
}

static bool in_bounds(const struct kbp_netap *s, u32 v)
{
	return v >= s->p.min_interval_us && v <= s->p.max_interval_us;
}

static void check_state(const struct kbp_netap *s, u32 ret, const char *what)
{
	CHECK(ret == s->interval_us, "%s: returned %u, state says %u", what,
	      ret, s->interval_us);
	CHECK(in_bounds(s, ret), "%s: interval %u outside [%u, %u]", what, ret,
	      s->p.min_interval_us, s->p.max_interval_us);
	CHECK(in_bounds(s, s->low_us) && in_bounds(s, s->high_us),
	      "%s: probes %u/%u outside [%u, %u]", what, s->low_us, s->high_us,
	      s->p.min_interval_us, s->p.max_interval_us);
	CHECK(s->range_lo_us >= s->p.min_interval_us &&
	      s->range_hi_us <= s->p.max_interval_us &&
	      s->range_lo_us <= s->range_hi_us,
	      "%s: bracket %u..%u outside [%u, %u]", what, s->range_lo_us,
	      s->range_hi_us, s->p.min_interval_us, s->p.max_interval_us);
}

/*
 * Search @c from the state in @s until converged; the number of rounds it
 * took, or -1 if it had not converged after 40.
 */
static int converge(struct kbp_netap *s, const struct curve *c,
		    double noise_pct, const char *what)
{
	int n;
	u32 ret;

	for (n = 1; n <= 40; n++) {
		ret = kbp_netap_round(s, measure(c, s->interval_us, noise_pct));
		check_state(s, ret, what);
		if (s->converged)
			return n;
	}
	return -1;
}

struct result {
	int rounds;
	u32 final;
	double dist;		/* us from the peak (or the cap) */
	double ratio;		/* true bytes at final / best in range */
};

static struct result search(const struct kbp_netap_params *p,
			    const struct curve *c, double noise_pct,
			    const char *what)
{
	struct kbp_netap s;
	struct result r;
	u32 at = 0;
	double best;

	CHECK(kbp_netap_init(&s, p) == 0, "%s: init refused", what);
	check_state(&s, s.interval_us, what);
	r.rounds = converge(&s, c, noise_pct, what);
	r.final = s.interval_us;
	best = peak_in(c, p->min_interval_us, p->max_interval_us, &at);
	/* with a cap below the peak, the best reachable is the cap */
	if (c->peak >= p->min_interval_us && c->peak <= p->max_interval_us)
		r.dist = peak_dist(c, r.final);
	else
		r.dist = fabs((double)r.final - at);
	r.ratio = curve_f(c, r.final) / best;
	if (noise_pct == 0 && c->shape != FLAT) {
		/* noise-free and strictly unimodal: the peak never leaves */
		CHECK(at >= s.range_lo_us && at <= s.range_hi_us,
		      "%s: best %u left the bracket %u..%u", what, at,
		      s.range_lo_us, s.range_hi_us);
	}
	return r;
}

static const u32 peaks[] = {
	100, 115, 140, 250, 500, 800, 1000, 1590, 2000, 2510, 3000, 3500,
	3900, 3950, 3985, 4000,
};

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

/* The paper's table comes out of the default range exactly. */
static void test_paper_table(void)
{
	static const u32 paper[] = {
		2410, 1490, 921, 569, 352, 217, 134, 83, 51, 32,
	};
	struct kbp_netap_params p;
	struct kbp_netap s;
	unsigned int k;

	kbp_netap_default_params(&p);
	for (k = 0; k < ARRAY_SIZE(paper); k++)
		CHECK(kbp_netap_distance(&p, k + 1) == paper[k],
		      "distance %u is %u, paper %u", k + 1,
		      kbp_netap_distance(&p, k + 1), paper[k]);
	CHECK(kbp_netap_distance(&p, 11) <= KBP_NETAP_MIN_DISTANCE_US,
	      "distance 11 is %u, above MinDistance",
	      kbp_netap_distance(&p, 11));
	CHECK(kbp_netap_init(&s, &p) == 0, "defaults refused");
	/* rounds 0 and 1 use the first distance: 100 + 2410, 4000 - 2410 */
	CHECK(s.interval_us == 2510 && s.low_us == 2510 && s.high_us == 1590,
	      "first probes %u (low %u, high %u), expected 2510 and 1590",
	      s.interval_us, s.low_us, s.high_us);
	CHECK(s.round == 1 && !s.converged && s.dist_idx == 1,
	      "state after init: round %u converged %u idx %u", s.round,
	      s.converged, s.dist_idx);
	kbp_netap_round(&s, 1000);
	CHECK(s.interval_us == 1590 && s.perf_low == 1000,
	      "round 1 measured low (%llu), next is high: %u",
	      (unsigned long long)s.perf_low, s.interval_us);
}

static void table_row(const char *shape, const char *noise, u32 peak,
		      const struct kbp_netap_params *p, const struct result *r)
{
	char final[16] = "worst";

	/* the noisy rows are the worst of their seeds: no single final */
	if (r->final)
		snprintf(final, sizeof(final), "%u", r->final);
	printf("%-9s %-6s peak %4u range %4u..%-4u rounds %2d final %5s "
	       "off %4.0f us  bytes %.4f of best\n", shape, noise, peak,
	       p->min_interval_us, p->max_interval_us, r->rounds, final,
	       r->dist, r->ratio);
}

/* Every shape, every peak, no noise: within 60 us in at most 12 rounds. */
static void test_curves(void)
{
	struct kbp_netap_params p;
	struct curve c = { .height = HEIGHT, .plateau = 150 };
	struct result r;
	unsigned int i;
	int sh;
	char what[64];

	kbp_netap_default_params(&p);
	printf("== noise-free curves, default range\n");
	for (sh = TENT; sh <= SPIKE; sh++) {
		for (i = 0; i < ARRAY_SIZE(peaks); i++) {
			c.shape = sh;
			c.peak = peaks[i];
			snprintf(what, sizeof(what), "%s peak %u",
				 shape_name[sh], peaks[i]);
			r = search(&p, &c, 0, what);
			table_row(shape_name[sh], "none", peaks[i], &p, &r);
			CHECK(r.rounds >= 1 && r.rounds <= MAX_ROUNDS,
			      "%s: %d rounds", what, r.rounds);
			CHECK(r.dist <= PEAK_TOL_US, "%s: ended at %u, %.0f us off",
			      what, r.final, r.dist);
		}
	}
}

/*
 * +-1 % noise, 20 seeds per curve.  The search compares two rounds of one
 * sample each, so a comparison can go wrong when the two probes' true bytes
 * are less than 2 % apart.
 *  - tent, asym, peaky, flat: the curve falls by more than the noise within
 *    60 us of the peak and, relative to its value, everywhere else: the
 *    search must end within 60 us.
 *  - gentle, shallow, parabola: 1.2 %, 0.6 % and 0.06 % down at 60 us.
 *    One noisy round per probe cannot tell the peak's neighbours apart, so
 *    the check is on what the search is for: bytes within 5 % of the best.
 *  - spike: a 200 us wide peak on a tail falling 1 % per 100 us.  Mid-search
 *    the probes sit on the tail, 2 % apart; a noisy comparison there can
 *    drop the peak from the bracket for good (the paper's search never
 *    looks back).  Printed, not checked beyond rounds: a known limit.
 */
static void test_noisy(void)
{
	struct kbp_netap_params p;
	struct curve c = { .height = HEIGHT, .plateau = 150 };
	struct result r;
	unsigned int i, seed;
	int sh, worst_rounds;
	double worst_dist, worst_ratio;
	char what[80];
	bool strict;

	kbp_netap_default_params(&p);
	printf("== +-1 %% noise, default range, worst of 20 seeds\n");
	for (sh = TENT; sh <= SPIKE; sh++) {
		strict = sh < GENTLE;
		for (i = 0; i < ARRAY_SIZE(peaks); i++) {
			c.shape = sh;
			c.peak = peaks[i];
			worst_rounds = 0;
			worst_dist = 0;
			worst_ratio = 1;
			for (seed = 1; seed <= 20; seed++) {
				lcg_state = seed * 0x9e3779b97f4a7c15ULL + peaks[i];
				snprintf(what, sizeof(what),
					 "%s peak %u noise 1%% seed %u",
					 shape_name[sh], peaks[i], seed);
				r = search(&p, &c, 1.0, what);
				CHECK(r.rounds >= 1 && r.rounds <= MAX_ROUNDS,
				      "%s: %d rounds", what, r.rounds);
				if (strict)
					CHECK(r.dist <= PEAK_TOL_US,
					      "%s: ended at %u, %.0f us off", what,
					      r.final, r.dist);
				else if (sh != SPIKE)
					CHECK(r.ratio >= NOISY_RATIO,
					      "%s: ended at %u, %.4f of best", what,
					      r.final, r.ratio);
				if (r.rounds > worst_rounds)
					worst_rounds = r.rounds;
				if (r.dist > worst_dist)
					worst_dist = r.dist;
				if (r.ratio < worst_ratio)
					worst_ratio = r.ratio;
			}
			r.rounds = worst_rounds;
			r.dist = worst_dist;
			r.ratio = worst_ratio;
			r.final = 0;
			table_row(shape_name[sh], "1%", peaks[i], &p, &r);
		}
	}
}

/* A latency cap or a narrower range: the search stays inside it. */
static void test_caps(void)
{
	static const struct { u32 min, max, peak; } cases[] = {
		{ 100, 1000, 2500 },	/* peak above the cap: ends at the cap */
		{ 100, 1000, 500 },
		{ 100, 1000, 130 },
		{ 100, 250, 3000 },
		{ 100, 250, 180 },
		{ 500, 600, 550 },
		{ 500, 600, 100 },	/* peak below the range */
		{ 777, 777, 2000 },	/* a fixed interval */
		{ 10, 100000, 60000 },	/* the widest range */
		{ 10, 100000, 20 },
		{ 100, 4000, 4000 },
	};
	struct kbp_netap_params p;
	struct curve c = { .shape = TENT, .height = HEIGHT };
	struct result r;
	unsigned int i;
	char what[80];

	printf("== ranges narrowed by a latency cap, tent, no noise\n");
	kbp_netap_default_params(&p);
	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		p.min_interval_us = cases[i].min;
		p.max_interval_us = cases[i].max;
		c.peak = cases[i].peak;
		snprintf(what, sizeof(what), "range %u..%u peak %u",
			 cases[i].min, cases[i].max, cases[i].peak);
		r = search(&p, &c, 0, what);
		table_row("tent", "none", cases[i].peak, &p, &r);
		CHECK(r.rounds >= 1 && r.rounds <= MAX_ROUNDS + 6 &&
		      r.rounds < KBP_NETAP_MAX_ROUND_LO - 1,
		      "%s: %d rounds", what, r.rounds);
		if (cases[i].max - cases[i].min <= 4000)
			CHECK(r.rounds <= MAX_ROUNDS, "%s: %d rounds", what,
			      r.rounds);
		CHECK(r.dist <= PEAK_TOL_US, "%s: ended at %u, %.0f us off",
		      what, r.final, r.dist);
	}
}

/* The curve shifts after convergence: restart, then the new peak. */
static void test_shift(void)
{
	struct kbp_netap_params p;
	struct curve a = { .shape = PEAKY, .peak = 800, .height = HEIGHT };
	struct curve b = { .shape = TENT, .peak = 3000, .height = HEIGHT / 2 };
	struct curve b2 = { .shape = TENT, .peak = 3100, .height = HEIGHT / 2 };
	struct kbp_netap s;
	int n, i;
	u32 ret;

	printf("== shifts after convergence\n");
	kbp_netap_default_params(&p);
	kbp_netap_init(&s, &p);
	n = converge(&s, &a, 0, "shift: first curve");
	CHECK(s.converged && peak_dist(&a, s.interval_us) <= PEAK_TOL_US,
	      "shift: first curve ended at %u after %d rounds",
	      s.interval_us, n);
	printf("first curve (peaky, peak 800): %d rounds, at %u\n", n,
	       s.interval_us);
	/* a few steady rounds: no restart */
	for (i = 0; i < 5; i++)
		kbp_netap_round(&s, measure(&a, s.interval_us, 1.0));
	CHECK(s.converged && s.restarts == 0,
	      "shift: steady rounds restarted the search (%u)", s.restarts);

	/* the workload changes: bytes at the converged interval drop */
	ret = kbp_netap_round(&s, measure(&b, s.interval_us, 0));
	CHECK(!s.converged && s.round == 1 && s.restarts == 1 &&
	      s.started_by == KBP_NETAP_START_CHANGE && ret == 2510,
	      "shift: no restart after the change: converged %u round %u "
	      "restarts %u started_by %u next %u", s.converged, s.round,
	      s.restarts, s.started_by, ret);
	n = converge(&s, &b, 0, "shift: second curve");
	CHECK(n >= 1 && n <= MAX_ROUNDS, "shift: %d rounds after restart", n);
	CHECK(s.converged && peak_dist(&b, s.interval_us) <= PEAK_TOL_US,
	      "shift: second curve (peak 3000) ended at %u", s.interval_us);
	printf("after the shift (tent, peak 3000, half the bytes): restarted, "
	       "%d rounds, at %u\n", n, s.interval_us);

	/*
	 * A shift that leaves the bytes at the current interval within
	 * MinChange is not seen (the paper's rule compares bytes only)
	 * until MaxRound restarts the search.
	 */
	p.max_round = 40;
	kbp_netap_init(&s, &p);
	converge(&s, &b, 0, "shift 2: first curve");
	ret = s.interval_us;
	for (i = 0; s.restarts == 0 && i < 100; i++)
		kbp_netap_round(&s, measure(&b2, s.interval_us, 0));
	CHECK(s.restarts == 1 && s.started_by == KBP_NETAP_START_MAX_ROUND,
	      "shift 2: restarts %u started_by %u", s.restarts, s.started_by);
	n = converge(&s, &b2, 0, "shift 2: second curve");
	CHECK(s.converged && peak_dist(&b2, s.interval_us) <= PEAK_TOL_US,
	      "shift 2: ended at %u (peak 3100)", s.interval_us);
	printf("small shift 3000 -> 3100 (bytes within MinChange at %u): "
	       "found after the MaxRound restart, %d rounds, at %u\n", ret, n,
	       s.interval_us);

	/* idle while converged, then traffic: 0 -> anything is a change */
	kbp_netap_round(&s, 0);
	CHECK(!s.converged && s.started_by == KBP_NETAP_START_CHANGE,
	      "idle round did not restart");
	kbp_netap_init(&s, &p);
	converge(&s, &a, 0, "idle");
	/* 0 bytes against a non-zero reference: restart; then 0 against 0 */
	kbp_netap_round(&s, 0);
	converge(&s, &(struct curve){ .shape = TENT, .peak = 1, .height = 0 },
		 0, "idle search");
	i = s.restarts;
	kbp_netap_round(&s, 0);
	CHECK(s.converged && (int)s.restarts == i,
	      "0 bytes after 0 bytes restarted the search");
}

/* MaxRound: the search restarts when round reaches it, converged or not. */
static void test_max_round(void)
{
	struct kbp_netap_params p;
	struct curve c = { .shape = TENT, .peak = 1200, .height = HEIGHT };
	struct kbp_netap s;
	u32 n, ret = 0;
	int k;

	printf("== MaxRound\n");
	kbp_netap_default_params(&p);
	p.max_round = 40;
	kbp_netap_init(&s, &p);
	for (k = 1; k <= 2; k++) {
		/* round 0 ran at the start; 39 more reach round 40 */
		for (n = 1; n < p.max_round - 1; n++) {
			ret = kbp_netap_round(&s, measure(&c, s.interval_us,
							  1.0));
			check_state(&s, ret, "max_round");
			CHECK(s.round == n + 1, "max_round: round %u after %u "
			      "rounds", s.round, n);
		}
		CHECK(s.converged && s.restarts == (u32)k - 1,
		      "max_round: converged %u restarts %u before round %u",
		      s.converged, s.restarts, p.max_round);
		CHECK(peak_dist(&c, s.interval_us) <= PEAK_TOL_US,
		      "max_round: at %u", s.interval_us);
		ret = kbp_netap_round(&s, measure(&c, s.interval_us, 1.0));
		CHECK(!s.converged && s.round == 1 && s.restarts == (u32)k &&
		      s.started_by == KBP_NETAP_START_MAX_ROUND && ret == 2510,
		      "max_round: after round %u: converged %u round %u "
		      "restarts %u started_by %u next %u", p.max_round,
		      s.converged, s.round, s.restarts, s.started_by, ret);
	}
	printf("restarted at round %u twice, then converged again\n",
	       p.max_round);

	/* kbp_netap_restart() */
	kbp_netap_restart(&s);
	CHECK(s.round == 1 && !s.converged &&
	      s.started_by == KBP_NETAP_START_CALLER && s.restarts == 3,
	      "restart(): round %u started_by %u", s.round, s.started_by);

	/* steady +-1 % noise never crosses the default MinChange */
	kbp_netap_default_params(&p);
	p.max_round = KBP_NETAP_MAX_ROUND_HI;
	kbp_netap_init(&s, &p);
	converge(&s, &c, 1.0, "steady");
	for (n = 0; n < 5000; n++)
		kbp_netap_round(&s, measure(&c, s.interval_us, 1.0));
	CHECK(s.converged && s.restarts == 0,
	      "steady noisy rounds restarted the search %u times", s.restarts);
}

/*
 * Whatever the bytes (random, zero, near 2^64) and whatever the range, the
 * interval stays inside [min, max].
 */
static void test_bounds(void)
{
	static const struct { u32 min, max; } ranges[] = {
		{ 100, 4000 }, { 100, 1000 }, { 100, 101 }, { 100, 102 },
		{ 100, 130 }, { 10, 10 }, { 10, 100000 }, { 99999, 100000 },
		{ 3000, 4000 }, { 100000, 100000 }, { 10, 11 }, { 37, 4023 },
	};
	struct kbp_netap_params p;
	struct kbp_netap s;
	unsigned int i, n;
	u64 bytes;
	u32 ret;

	kbp_netap_default_params(&p);
	p.max_round = KBP_NETAP_MAX_ROUND_LO;
	lcg_state = 42;
	for (i = 0; i < ARRAY_SIZE(ranges); i++) {
		p.min_interval_us = ranges[i].min;
		p.max_interval_us = ranges[i].max;
		CHECK(kbp_netap_init(&s, &p) == 0, "range %u..%u refused",
		      ranges[i].min, ranges[i].max);
		check_state(&s, s.interval_us, "bounds init");
		for (n = 0; n < 20000; n++) {
			switch (lcg() % 4) {
			case 0:
				bytes = 0;
				break;
			case 1:
				bytes = ~0ULL - lcg() % 1000;
				break;
			default:
				bytes = lcg() >> (lcg() % 53);
				break;
			}
			ret = kbp_netap_round(&s, bytes);
			check_state(&s, ret, "bounds");
			if (!in_bounds(&s, ret))
				break;
		}
	}
}

static void test_params(void)
{
	static const struct {
		struct kbp_netap_params p;
		int err;
	} cases[] = {
		{ { 100, 4000, 20, 300 }, 0 },
		{ { 10, 100000, 1, 20 }, 0 },
		{ { 100000, 100000, 1000, 1000000 }, 0 },
		{ { 9, 4000, 20, 300 }, -ERANGE },
		{ { 0, 4000, 20, 300 }, -ERANGE },
		{ { 100001, 100001, 20, 300 }, -ERANGE },
		{ { 100, 9, 20, 300 }, -ERANGE },
		{ { 100, 100001, 20, 300 }, -ERANGE },
		{ { 100, 0xffffffff, 20, 300 }, -ERANGE },
		{ { 4000, 100, 20, 300 }, -EINVAL },
		{ { 101, 100, 20, 300 }, -EINVAL },
		{ { 100, 4000, 0, 300 }, -ERANGE },
		{ { 100, 4000, 1001, 300 }, -ERANGE },
		{ { 100, 4000, 20, 19 }, -ERANGE },
		{ { 100, 4000, 20, 0 }, -ERANGE },
		{ { 100, 4000, 20, 1000001 }, -ERANGE },
	};
	struct kbp_netap s, before;
	const char *why;
	unsigned int i;
	int err;

	for (i = 0; i < ARRAY_SIZE(cases); i++) {
		why = "unset";
		err = kbp_netap_check_params(&cases[i].p, &why);
		CHECK(err == cases[i].err, "params %u: %d, expected %d", i, err,
		      cases[i].err);
		CHECK(err ? why && strstr(why, "range") : !why,
		      "params %u: message \"%s\"", i, why ? why : "(null)");
		if (err)
			printf("refused (%d): %s\n", err, why);
		memset(&s, 0x5a, sizeof(s));
		before = s;
		err = kbp_netap_init(&s, &cases[i].p);
		CHECK(err == cases[i].err, "init %u: %d", i, err);
		if (err)
			CHECK(!memcmp(&s, &before, sizeof(s)),
			      "init %u changed the state it refused", i);
	}
	CHECK(kbp_netap_check_params(&cases[3].p, NULL) == -ERANGE,
	      "NULL why");
}

int main(void)
{
	test_paper_table();
	test_curves();
	test_noisy();
	test_caps();
	test_shift();
	test_max_round();
	test_bounds();
	test_params();
	printf("%d checks, %d failed\n", checks, failures);
	return failures ? 1 : 0;
}
