// SPDX-License-Identifier: GPL-2.0
/*
 * kbp NetAP search: the golden-section search of the polling interval
 * (netap.txt Sect. 3.4.3, Algorithm 2) and the restart rules around it
 * (Algorithm 1 lines 3-6, 10-19).  The caller runs rounds of fixed length,
 * counts the bytes its poller processed in each, and at the end of a round
 * calls kbp_netap_round() with them; the value returned is the polling
 * interval of the next round.  kbp_netap_init() runs round 0, so the first
 * interval is in s->interval_us before any round.
 *
 * The objective is "bytes": any u64 where more is better will do (the
 * bytes-per-CPU objective of issue 10 passes a scaled ratio).
 *
 * Integer arithmetic only, and no division: the distances are R^k times the
 * width of the range, with R^k precomputed in Q32, so the kernel needs no
 * 64-bit division helper on 32-bit machines and never touches the FPU.
 *
 * Locking: none.  One struct kbp_netap belongs to one poller, which alone
 * calls these functions on it (the module reads it for status under its
 * own lock).
 *
 * Where this differs from the paper's pseudo-code, and why:
 *  - The distances come from a table, as in the paper's kernel version
 *    (2410, 1490, ... 32 for 100..4000 us): distance k is
 *    round((MaxInterval - MinInterval) * R^k), which reproduces that table
 *    exactly and scales it when a latency cap narrows the range.  The search
 *    ends when the next distance would be <= MinDistance, i.e. when the
 *    table runs out: "limited to 11 iterations" in the paper.  (Line 18 of
 *    Algorithm 2, run literally with floating point, would take one more
 *    step with a distance of 20.)
 *  - When it ends, the search keeps the better of its last two probes; the
 *    pseudo-code (line 19) keeps whichever was measured last, which may be
 *    the worse one.  Both were measured; the choice costs nothing.
 *  - Once converged, bytes are compared with the previous round's; the first
 *    converged round is compared with the bytes measured at the chosen
 *    interval, not with the last probe's (which may be the other interval).
 */
#include "kbp_netap.h"

/* round(R^k * 2^32) for R = 618/1000, k = 1..KBP_NETAP_NR_DIST */
static const u32 kbp_netap_rq32[KBP_NETAP_NR_DIST] = {
	2654289789U, 1640351090U, 1013736973U, 626489450U, 387170480U,
	239271357U, 147869698U, 91383474U, 56474987U, 34901542U,
	21569153U, 13329736U, 8237777U, 5090946U, 3146205U,
	1944355U, 1201611U, 742596U, 458924U, 283615U,
	175274U, 108319U, 66941U, 41370U,
};

void kbp_netap_default_params(struct kbp_netap_params *p)
{
	p->min_interval_us = KBP_NETAP_MIN_INTERVAL_US;
	p->max_interval_us = KBP_NETAP_MAX_INTERVAL_US;
	p->min_change_pct = KBP_NETAP_MIN_CHANGE_PCT_DEF;
	p->max_round = KBP_NETAP_MAX_ROUND_DEF;
}

/*
 * 0, -ERANGE for a value out of its range, -EINVAL for a range whose minimum
 * is above its maximum.  *why (if @why is not NULL) gets a static message
 * naming the knob and its accepted range.
 */
int kbp_netap_check_params(const struct kbp_netap_params *p,
			   const char **why)
{
	const char *msg = NULL;
	int err = -ERANGE;

	if (p->min_interval_us < KBP_NETAP_INTERVAL_US_LO ||
	    p->min_interval_us > KBP_NETAP_INTERVAL_US_HI) {
		msg = "min_interval_us out of range ("
		      KBP_NETAP_STR(KBP_NETAP_INTERVAL_US_LO) "-"
		      KBP_NETAP_STR(KBP_NETAP_INTERVAL_US_HI) ")";
	} else if (p->max_interval_us < KBP_NETAP_INTERVAL_US_LO ||
		   p->max_interval_us > KBP_NETAP_INTERVAL_US_HI) {
		msg = "max_interval_us out of range ("
		      KBP_NETAP_STR(KBP_NETAP_INTERVAL_US_LO) "-"
		      KBP_NETAP_STR(KBP_NETAP_INTERVAL_US_HI) ")";
	} else if (p->min_interval_us > p->max_interval_us) {
		msg = "min_interval_us above max_interval_us: empty range";
		err = -EINVAL;
	} else if (p->min_change_pct < KBP_NETAP_MIN_CHANGE_PCT_LO ||
		   p->min_change_pct > KBP_NETAP_MIN_CHANGE_PCT_HI) {
		msg = "min_change out of range ("
		      KBP_NETAP_STR(KBP_NETAP_MIN_CHANGE_PCT_LO) "-"
		      KBP_NETAP_STR(KBP_NETAP_MIN_CHANGE_PCT_HI) " percent)";
	} else if (p->max_round < KBP_NETAP_MAX_ROUND_LO ||
		   p->max_round > KBP_NETAP_MAX_ROUND_HI) {
		msg = "max_round out of range ("
		      KBP_NETAP_STR(KBP_NETAP_MAX_ROUND_LO) "-"
		      KBP_NETAP_STR(KBP_NETAP_MAX_ROUND_HI) ")";
	}
	if (why)
		*why = msg;
	return msg ? err : 0;
}

/*
 * Distance k (k >= 1) of the search over @p's range: the width of the range
 * times R^k, rounded.  0 past the table; the search has ended long before
 * (the range is at most 99990 us wide, and 99990 * R^17 < MinDistance).
 */
u32 kbp_netap_distance(const struct kbp_netap_params *p, u32 k)
{
	u64 width = p->max_interval_us - p->min_interval_us;

	if (k < 1 || k > KBP_NETAP_NR_DIST)
		return 0;
	/* width < 2^17 and R^k * 2^32 < 2^32: the product fits in 49 bits */
	return (u32)((width * kbp_netap_rq32[k - 1] + (1ULL << 31)) >> 32);
}

static u32 kbp_netap_clamp(u32 v, u32 lo, u32 hi)
{
	return v < lo ? lo : v > hi ? hi : v;
}

/*
 * Did the bytes move by more than @pct percent of @prev?  |cur - prev| * 100
 * against prev * pct, without overflow: pct <= 1000 < 2^10, so both sides
 * fit in 64 bits once the counts are below 2^53 (we halve both until they
 * are; only counts of petabytes per round get there).
 */
static bool kbp_netap_changed(u64 prev, u64 cur, u32 pct)
{
	u64 delta = cur > prev ? cur - prev : prev - cur;

	while (prev >= (1ULL << 53) || delta >= (1ULL << 53)) {
		prev >>= 1;
		delta >>= 1;
	}
	return delta * 100 > prev * pct;
}

/*
 * (Re)start: Algorithm 1 lines 3-6 (round and bytes back to 0), then round 0
 * of Algorithm 2 (lines 2-5) at once, as Algorithm 1 does when its loop comes
 * round with next_time already due, and line 16 (round 1 is next).  The
 * first probe is interval_low, the longer one, at MinInterval + distance.
 * interval_high (line 9) uses the same distance; it is set now rather than
 * in round 1 so that status shows both probes from the start.
 */
static void kbp_netap_start(struct kbp_netap *s, enum kbp_netap_start why)
{
	const struct kbp_netap_params *p = &s->p;

	/* line 3: distance = R * (MaxInterval - MinInterval) */
	s->dist_idx = 1;
	s->distance_us = kbp_netap_distance(p, 1);
	/* line 4 */
	s->low_us = p->min_interval_us + s->distance_us;
	/* line 9: */
	s->high_us = p->max_interval_us - s->distance_us;
	s->range_lo_us = p->min_interval_us;
	s->range_hi_us = p->max_interval_us;
	s->perf_low = 0;
	s->perf_high = 0;
	s->best_bytes = 0;
	s->prev_bytes = 0;
	s->selected = KBP_NETAP_PROBE_LOW;
	s->converged = 0;
	if (why != KBP_NETAP_START_INIT)
		s->restarts++;
	s->started_by = why;
	/* line 5 */
	s->interval_us = s->low_us;
	s->round = 1;
}

/* The search ends (lines 18-19): keep the better probe. */
static void kbp_netap_converge(struct kbp_netap *s)
{
	/* ties go to the shorter interval, as in line 22 */
	if (s->perf_low > s->perf_high) {
		s->interval_us = s->low_us;
		s->best_bytes = s->perf_low;
	} else {
		s->interval_us = s->high_us;
		s->best_bytes = s->perf_high;
	}
	s->prev_bytes = s->best_bytes;
	s->converged = 1;
}

/*
 * Algorithm 2 for round >= 1: @bytes were processed at s->interval_us, the
 * probe s->selected.  Sets s->interval_us for the next round.
 */
static void kbp_netap_search(struct kbp_netap *s, u64 bytes)
{
	u32 next, temp;

	/* lines 7-12: round 1 measured interval_low; now measure interval_high */
	if (s->round == 1) {
		s->perf_low = bytes;
		s->selected = KBP_NETAP_PROBE_HIGH;
		s->interval_us = s->high_us;
		return;
	}
	/* lines 13-17: the round just ended measured the probe selected */
	if (s->selected == KBP_NETAP_PROBE_LOW)
		s->perf_low = bytes;
	else
		s->perf_high = bytes;

	/*
	 * lines 18-21: distance <- distance * R, and stop at MinDistance.  The
	 * next distance is tested, not the current one: the paper's table (and
	 * so its search) ends at the last distance above MinDistance.
	 */
	next = kbp_netap_distance(&s->p, s->dist_idx + 1);
	if (next <= KBP_NETAP_MIN_DISTANCE_US) {
		kbp_netap_converge(s);
		return;
	}
	s->dist_idx++;
	s->distance_us = next;

	if (s->perf_low > s->perf_high) {
		/*
		 * lines 22-28: the longer probe did better, so on a unimodal
		 * curve the peak is above interval_high: the bracket loses
		 * everything below it.  interval_low, now at 0.382 of the new
		 * bracket, becomes its interval_high (measured already); the new
		 * interval_low is the point at 0.618, distance above the
		 * bracket's new lower end, and is measured next.
		 */
		s->range_lo_us = s->high_us;
		temp = s->high_us;
		s->high_us = s->low_us;
		s->low_us = temp + s->distance_us;
		s->perf_high = s->perf_low;
		s->selected = KBP_NETAP_PROBE_LOW;
	} else {
		/*
		 * lines 29-35: the shorter probe did at least as well; the peak
		 * is below interval_low, which becomes the bracket's upper end.
		 * interval_high moves to interval_low and the new interval_high
		 * is distance below the new upper end.
		 */
		s->range_hi_us = s->low_us;
		temp = s->low_us;
		s->low_us = s->high_us;
		s->high_us = temp - s->distance_us;
		s->perf_low = s->perf_high;
		s->selected = KBP_NETAP_PROBE_HIGH;
	}
	/*
	 * The distances are rounded, so keep the probes inside the bracket
	 * (and so inside [MinInterval, MaxInterval]) whatever the rounding did.
	 */
	s->low_us = kbp_netap_clamp(s->low_us, s->range_lo_us, s->range_hi_us);
	s->high_us = kbp_netap_clamp(s->high_us, s->range_lo_us,
				     s->range_hi_us);
	/* line 28 or 35 */
	s->interval_us = s->selected == KBP_NETAP_PROBE_LOW ?
			 s->low_us : s->high_us;
}

/* 0, or what kbp_netap_check_params() says (and then @s is not touched). */
int kbp_netap_init(struct kbp_netap *s, const struct kbp_netap_params *p)
{
	int err = kbp_netap_check_params(p, NULL);

	if (err)
		return err;
	s->p = *p;
	s->restarts = 0;
	kbp_netap_start(s, KBP_NETAP_START_INIT);
	return 0;
}

/* Start the search again now; the next round measures the first probe. */
void kbp_netap_restart(struct kbp_netap *s)
{
	kbp_netap_start(s, KBP_NETAP_START_CALLER);
}

/*
 * End of a round (Algorithm 1 lines 9-19): @bytes were processed in it, at
 * s->interval_us.  Returns the interval of the next round.
 */
u32 kbp_netap_round(struct kbp_netap *s, u64 bytes)
{
	if (s->converged &&
	    kbp_netap_changed(s->prev_bytes, bytes, s->p.min_change_pct)) {
		/*
		 * line 11: the interval no longer changes and the load moved
		 * by more than MinChange: the curve the search climbed may
		 * have moved with it; go to start (line 12).
		 */
		kbp_netap_start(s, KBP_NETAP_START_CHANGE);
		return s->interval_us;
	}
	if (s->converged)
		s->prev_bytes = bytes;
	else
		kbp_netap_search(s, bytes);	/* line 10 */
	/*
	 * lines 16-19: the round count includes round 0, so the search
	 * restarts every MaxRound - 1 measured rounds even when nothing
	 * changed; that catches drifts too slow for MinChange.
	 */
	if (++s->round >= s->p.max_round)
		kbp_netap_start(s, KBP_NETAP_START_MAX_ROUND);
	return s->interval_us;
}
