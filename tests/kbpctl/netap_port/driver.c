// SPDX-License-Identifier: GPL-2.0
/*
 * Drives module/kbp_netap.c from a script on stdin and prints its whole state after every
 * step, for tests/kbpctl/test_netap_port.py to compare with the Python port (kbp.netap).
 *
 *   P min max pct maxround   kbp_netap_check_params() + kbp_netap_init() (a new search)
 *   B value                  kbp_netap_round(value)
 *   X                        kbp_netap_restart()
 *   D min max k              kbp_netap_distance()
 *
 * Output, one line per command: "E err msg" (P refused), "D d", or "S" and the state.
 */
#include <stdio.h>
#include <string.h>

#include "kbp_netap.h"

static void show(const struct kbp_netap *s, u32 ret)
{
	printf("S %u %u %u %u %u %u %u %u %u %llu %llu %llu %llu %u %u %u %u\n",
	       ret, s->round, s->interval_us, s->low_us, s->high_us, s->range_lo_us,
	       s->range_hi_us, s->distance_us, s->dist_idx, s->perf_low, s->perf_high,
	       s->best_bytes, s->prev_bytes, s->restarts, s->selected, s->converged,
	       s->started_by);
}

int main(void)
{
	struct kbp_netap s;
	struct kbp_netap_params p;
	char cmd[4];
	unsigned long long v;
	const char *why;
	unsigned int k;
	int err;

	memset(&s, 0, sizeof(s));
	while (scanf("%3s", cmd) == 1) {
		switch (cmd[0]) {
		case 'P':
			if (scanf("%u %u %u %u", &p.min_interval_us, &p.max_interval_us,
				  &p.min_change_pct, &p.max_round) != 4)
				return 2;
			err = kbp_netap_check_params(&p, &why);
			if (err) {
				printf("E %d %s\n", err, why);
				break;
			}
			if (kbp_netap_init(&s, &p))
				return 3;
			show(&s, s.interval_us);
			break;
		case 'B':
			if (scanf("%llu", &v) != 1)
				return 2;
			show(&s, kbp_netap_round(&s, v));
			break;
		case 'X':
			kbp_netap_restart(&s);
			show(&s, s.interval_us);
			break;
		case 'D':
			if (scanf("%u %u %u", &p.min_interval_us, &p.max_interval_us, &k) != 3)
				return 2;
			printf("D %u\n", kbp_netap_distance(&p, k));
			break;
		default:
			return 2;
		}
	}
	return 0;
}
