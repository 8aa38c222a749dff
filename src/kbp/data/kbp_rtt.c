// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp-rtt: the benchmark's UDP tester (part of kbp; built by `kbp.bench.tester` at setup time).
 *
 * It talks to an unmodified sockperf server (sockperf's 14-byte message header: be64 sequence,
 * be16 flags CLIENT|PONG, be32 length) and measures round-trip times with the kernel's software
 * timestamps (SO_TIMESTAMPING): the TX stamp is taken when the request reaches the device's
 * xmit (veth_xmit -> skb_tx_timestamp), the RX stamp when the reply enters the client
 * device's receive path (the benchmark turns GRO off there, so veth hands it to __netif_rx()
 * as the server sends it; with GRO on, when the client device's NAPI poll hands it to the
 * stack).  The tester's own scheduling (sendto() entry, wake-up after the
 * reply) is therefore NOT in the measured round trip.  User-space times are recorded too, for
 * comparison only.
 *
 * Modes
 *   rtt    open-loop requests with random (exponential, "poisson"), random uniform
 *          (--uniform MIN_US,MAX_US: each gap drawn uniformly from [MIN_US, MAX_US], the
 *          rt-socket-outsourcing paper's 1-10 ms) or constant inter-arrival times; one line
 *          per request on the samples file:  seq rtt_kernel_ns rtt_user_ns late_kernel_ns
 *          late_user_ns (rtt: -1 when there was no reply or no timestamp; late: the actual
 *          transmit -- the kernel's TX stamp, resp. the user-space time before send() --
 *          minus the schedule's intended send time, -1 when unknown).  The summary reports
 *          the gaps it planned.
 *   rate   constant-rate trial for the RFC 2544 search: sends in small batches (sendmmsg) and
 *          counts distinct replies; no per-packet timestamps.
 * A one-line JSON summary goes to stdout.
 *
 * The tester pins itself (-c CPU) and can run SCHED_FIFO (-f PRIO) so it is not delayed by
 * the load it shares a CPU with.
 *
 * It never busy-polls: SO_BUSY_POLL is set to 0 on its socket (lowering it needs no
 * capability), so net.core.busy_read / busy_poll (global on older kernels; the busypoll mode
 * sets them) do not make its recvmsg()/ppoll() spin on the client device's NAPI.  The value
 * read back with getsockopt() is in the summary ("so_busy_poll_us"; -1 if the kernel has no
 * SO_BUSY_POLL), and the benchmark refuses a run where it is not 0.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <getopt.h>
#include <linux/errqueue.h>
#include <linux/net_tstamp.h>
#include <math.h>
#include <netinet/in.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define HDR_LEN 14
#define FLAG_CLIENT 1
#define FLAG_PONG 2
#define FLAG_WARMUP 4
#define MAX_MSG 65000
#define BATCH 64
#ifndef SO_BUSY_POLL
#define SO_BUSY_POLL 46
#endif

static volatile sig_atomic_t stop_now;
static int busy_poll_read = -1;   /* SO_BUSY_POLL read back on the socket (-1: none) */

static void on_signal(int sig) { (void)sig; stop_now = 1; }

static int64_t now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int64_t ts_ns(const struct timespec *ts)
{
	return (int64_t)ts->tv_sec * 1000000000LL + ts->tv_nsec;
}

static void die(const char *what)
{
	fprintf(stderr, "kbp-rtt: %s: %s\n", what, strerror(errno));
	exit(2);
}

/* xorshift64*: small, seedable, good enough for inter-arrival times */
static uint64_t rng_state = 88172645463325252ULL;

static double rng_uniform(void)
{
	uint64_t x = rng_state;

	x ^= x >> 12;
	x ^= x << 25;
	x ^= x >> 27;
	rng_state = x;
	return ((x * 2685821657736338717ULL) >> 11) * (1.0 / 9007199254740992.0);
}

static void put_header(uint8_t *buf, uint64_t seq, uint16_t flags, uint32_t len)
{
	uint64_t s = htobe64(seq);
	uint16_t f = htons(flags);
	uint32_t l = htonl(len);

	memcpy(buf, &s, 8);
	memcpy(buf + 8, &f, 2);
	memcpy(buf + 10, &l, 4);
}

static uint64_t get_seq(const uint8_t *buf)
{
	uint64_t s;

	memcpy(&s, buf, 8);
	return be64toh(s);
}

struct opts {
	const char *ip;
	int port;
	int size;          /* UDP payload bytes (>= HDR_LEN) */
	double rate;       /* requests per second */
	int poisson;       /* exponential inter-arrival times */
	double uni_min_us; /* --uniform: gaps uniform in [uni_min_us, uni_max_us] (0: off) */
	double uni_max_us;
	double duration;   /* seconds of measured traffic */
	double warmup;     /* seconds of warm-up traffic (not reported) */
	double grace;      /* seconds to wait for late replies */
	int cpu;
	int fifo;
	const char *out;
	const char *mode;
	uint64_t seed;
};

/* the gap before the next request, ns: uniform, exponential or constant */
static int64_t next_gap(const struct opts *o, double mean_ns)
{
	if (o->uni_max_us > 0)
		return (int64_t)(1e3 * (o->uni_min_us +
				       (o->uni_max_us - o->uni_min_us) * rng_uniform()));
	if (o->poisson)
		return (int64_t)(-mean_ns * log(1.0 - rng_uniform()));
	return (int64_t)mean_ns;
}

static const char *arrival_name(const struct opts *o)
{
	if (o->uni_max_us > 0)
		return "uniform";
	return o->poisson ? "poisson" : "constant";
}

/* "MIN_US,MAX_US" with 0 < MIN_US <= MAX_US: 0 on success */
static int parse_uniform(const char *arg, double *lo, double *hi)
{
	char *end;

	*lo = strtod(arg, &end);
	if (end == arg || *end != ',')
		return -1;
	arg = end + 1;
	*hi = strtod(arg, &end);
	if (end == arg || *end)
		return -1;
	if (!(*lo > 0) || !(*hi >= *lo) || *hi > 60e6)
		return -1;
	return 0;
}

static int make_socket(const struct opts *o, int timestamps)
{
	struct sockaddr_in sa = { .sin_family = AF_INET, .sin_port = htons(o->port) };
	int fd = socket(AF_INET, SOCK_DGRAM, 0);
	int big = 8 << 20;

	if (fd < 0)
		die("socket");
	if (inet_pton(AF_INET, o->ip, &sa.sin_addr) != 1) {
		fprintf(stderr, "kbp-rtt: bad address %s\n", o->ip);
		exit(2);
	}
	if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &big, sizeof(big)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &big, sizeof(big));
	if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &big, sizeof(big)) < 0)
		setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &big, sizeof(big));
	if (timestamps) {
		int flags = SOF_TIMESTAMPING_TX_SOFTWARE | SOF_TIMESTAMPING_RX_SOFTWARE |
			    SOF_TIMESTAMPING_SOFTWARE | SOF_TIMESTAMPING_OPT_ID |
			    SOF_TIMESTAMPING_OPT_TSONLY;

		if (setsockopt(fd, SOL_SOCKET, SO_TIMESTAMPING, &flags, sizeof(flags)) < 0)
			die("SO_TIMESTAMPING");
	}
	{
		int zero = 0, got = -1;
		socklen_t len = sizeof(got);

		/* ENOPROTOOPT: a kernel without CONFIG_NET_RX_BUSY_POLL never busy-polls */
		if (setsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &zero, sizeof(zero)) < 0 &&
		    errno != ENOPROTOOPT)
			die("SO_BUSY_POLL");
		if (getsockopt(fd, SOL_SOCKET, SO_BUSY_POLL, &got, &len) == 0)
			busy_poll_read = got;
	}
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) < 0)
		die("connect");
	return fd;
}

static void place_self(const struct opts *o)
{
	if (o->cpu >= 0) {
		cpu_set_t set;

		CPU_ZERO(&set);
		CPU_SET(o->cpu, &set);
		if (sched_setaffinity(0, sizeof(set), &set) < 0)
			die("sched_setaffinity");
	}
	if (o->fifo > 0) {
		struct sched_param sp = { .sched_priority = o->fifo };

		if (sched_setscheduler(0, SCHED_FIFO, &sp) < 0)
			die("sched_setscheduler(SCHED_FIFO)");
	}
	mlockall(MCL_CURRENT | MCL_FUTURE); /* best effort: no page faults while measuring */
}

/* ---------------------------------------------------------------------------- rtt mode */

struct slot {
	int64_t intended; /* monotonic, the schedule's planned send time */
	int64_t tx_user;  /* monotonic, before sendto() */
	int64_t rx_user;  /* monotonic, after recvmsg() */
	int64_t tx_kern;  /* realtime, SO_TIMESTAMPING TX software stamp */
	int64_t rx_kern;  /* realtime, SO_TIMESTAMPING RX software stamp */
	uint8_t replies;
};

static uint64_t n_dup, n_bad, n_unknown;

static void drain_replies(int fd, struct slot *slots, uint64_t nslots, uint64_t sent)
{
	uint8_t buf[MAX_MSG];
	char ctrl[512];

	for (;;) {
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
				    .msg_control = ctrl, .msg_controllen = sizeof(ctrl) };
		ssize_t n = recvmsg(fd, &m, MSG_DONTWAIT);
		int64_t t = now_ns(), k = -1;
		struct cmsghdr *c;
		uint64_t seq;

		if (n < 0)
			return;
		if (n < HDR_LEN) {
			n_bad++;
			continue;
		}
		for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c))
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING) {
				struct scm_timestamping *st = (void *)CMSG_DATA(c);

				k = ts_ns(&st->ts[0]);
			}
		seq = get_seq(buf);
		if (seq >= sent || seq >= nslots) {
			n_unknown++;
			continue;
		}
		if (slots[seq].replies++) {
			n_dup++;
			continue;
		}
		slots[seq].rx_user = t;
		slots[seq].rx_kern = k ? k : -1;
	}
}

static void drain_errqueue(int fd, struct slot *slots, uint64_t nslots)
{
	char ctrl[512];
	uint8_t buf[64];

	for (;;) {
		struct iovec iov = { buf, sizeof(buf) };
		struct msghdr m = { .msg_iov = &iov, .msg_iovlen = 1,
				    .msg_control = ctrl, .msg_controllen = sizeof(ctrl) };
		struct sock_extended_err *ee = NULL;
		int64_t k = -1;
		struct cmsghdr *c;

		if (recvmsg(fd, &m, MSG_ERRQUEUE | MSG_DONTWAIT) < 0)
			return;
		for (c = CMSG_FIRSTHDR(&m); c; c = CMSG_NXTHDR(&m, c)) {
			if (c->cmsg_level == SOL_SOCKET && c->cmsg_type == SO_TIMESTAMPING) {
				struct scm_timestamping *st = (void *)CMSG_DATA(c);

				k = ts_ns(&st->ts[0]);
			} else if (c->cmsg_level == SOL_IP && c->cmsg_type == IP_RECVERR) {
				ee = (void *)CMSG_DATA(c);
			}
		}
		if (ee && ee->ee_origin == SO_EE_ORIGIN_TIMESTAMPING && ee->ee_data < nslots && k > 0)
			slots[ee->ee_data].tx_kern = k;
	}
}

static int run_rtt(const struct opts *o)
{
	double mean_ns = 1e9 / o->rate;
	uint64_t nslots = (uint64_t)((o->duration + o->warmup) * o->rate * 1.5) + 4096;
	struct slot *slots = calloc(nslots, sizeof(*slots));
	uint8_t msg[MAX_MSG];
	int fd = make_socket(o, 1);
	int64_t start, warm_end, end, next, deadline;
	uint64_t sent = 0, first_measured = 0, i, got = 0, lost = 0, no_ts = 0;
	int64_t gap_min = INT64_MAX, gap_max = 0, mono_to_real;
	double gap_sum = 0;
	uint64_t gaps = 0;
	FILE *out;

	if (!slots)
		die("calloc");
	memset(msg, 0, sizeof(msg));
	for (i = 0; i < nslots; i++)
		slots[i].tx_kern = slots[i].rx_kern = slots[i].tx_user = slots[i].rx_user = -1;
	place_self(o);

	{       /* realtime - monotonic, to compare the planned times with the kernel stamps */
		struct timespec r, m1, m2;

		clock_gettime(CLOCK_MONOTONIC, &m1);
		clock_gettime(CLOCK_REALTIME, &r);
		clock_gettime(CLOCK_MONOTONIC, &m2);
		mono_to_real = ts_ns(&r) - (ts_ns(&m1) + ts_ns(&m2)) / 2;
	}
	start = now_ns();
	warm_end = start + (int64_t)(o->warmup * 1e9);
	end = warm_end + (int64_t)(o->duration * 1e9);
	next = start;
	while (!stop_now) {
		int64_t t = now_ns();
		struct pollfd p = { .fd = fd, .events = POLLIN };
		struct timespec to;
		int64_t wait, gap;

		if (t >= next) {
			uint16_t flags = FLAG_CLIENT | FLAG_PONG;

			if (t >= end)
				break;
			if (sent >= nslots)
				break;
			if (t < warm_end)
				first_measured = sent + 1;
			put_header(msg, sent, flags, (uint32_t)o->size);
			slots[sent].intended = next;
			slots[sent].tx_user = now_ns();
			if (send(fd, msg, o->size, 0) < 0) {
				if (errno != ENOBUFS && errno != EAGAIN)
					die("send");
				slots[sent].tx_user = -1;
			}
			sent++;
			gap = next_gap(o, mean_ns);
			next += gap;
			if (gap < gap_min)
				gap_min = gap;
			if (gap > gap_max)
				gap_max = gap;
			gap_sum += gap;
			gaps++;
			continue;
		}
		wait = next - t;
		to.tv_sec = wait / 1000000000LL;
		to.tv_nsec = wait % 1000000000LL;
		if (ppoll(&p, 1, &to, NULL) > 0) {
			if (p.revents & POLLERR)
				drain_errqueue(fd, slots, nslots);
			if (p.revents & POLLIN)
				drain_replies(fd, slots, nslots, sent);
		}
	}
	/* wait for late replies and TX stamps */
	deadline = now_ns() + (int64_t)(o->grace * 1e9);
	while (now_ns() < deadline) {
		struct pollfd p = { .fd = fd, .events = POLLIN };
		uint64_t pending = 0;

		drain_errqueue(fd, slots, nslots);
		drain_replies(fd, slots, nslots, sent);
		for (i = first_measured; i < sent; i++)
			pending += !slots[i].replies || slots[i].tx_kern < 0;
		if (!pending)
			break;
		poll(&p, 1, 10);
	}

	out = o->out ? fopen(o->out, "w") : NULL;
	if (o->out && !out)
		die("open samples file");
	for (i = first_measured; i < sent; i++) {
		struct slot *s = &slots[i];
		int64_t rk = -1, ru = -1, lk = -1, lu = -1;

		if (s->replies) {
			got++;
			ru = s->rx_user - s->tx_user;
			if (s->tx_kern > 0 && s->rx_kern > 0)
				rk = s->rx_kern - s->tx_kern;
			else
				no_ts++;
		} else {
			lost++;
		}
		if (s->tx_user >= 0 && s->intended > 0)
			lu = s->tx_user - s->intended;
		if (s->tx_kern > 0 && s->intended > 0) {
			lk = s->tx_kern - (s->intended + mono_to_real);
			if (lk < 0)
				lk = 0; /* the clocks' offset is read to within ~100 ns */
		}
		if (out)
			fprintf(out, "%llu %lld %lld %lld %lld\n", (unsigned long long)i,
				(long long)rk, (long long)ru, (long long)lk, (long long)lu);
	}
	if (out)
		fclose(out);
	printf("{\"mode\": \"rtt\", \"sent\": %llu, \"received\": %llu, \"lost\": %llu, "
	       "\"no_timestamp\": %llu, \"duplicates\": %llu, \"unknown\": %llu, \"bad\": %llu, "
	       "\"warmup_sent\": %llu, \"elapsed_s\": %.6f, \"interrupted\": %s, "
	       "\"arrival\": \"%s\", \"gap_min_us\": %.3f, \"gap_max_us\": %.3f, "
	       "\"gap_mean_us\": %.3f, \"gaps\": %llu, \"so_busy_poll_us\": %d}\n",
	       (unsigned long long)(sent - first_measured), (unsigned long long)got,
	       (unsigned long long)lost, (unsigned long long)no_ts, (unsigned long long)n_dup,
	       (unsigned long long)n_unknown, (unsigned long long)n_bad,
	       (unsigned long long)first_measured, (now_ns() - start) / 1e9,
	       stop_now ? "true" : "false", arrival_name(o),
	       gaps ? gap_min / 1e3 : 0.0, gap_max / 1e3, gaps ? gap_sum / gaps / 1e3 : 0.0,
	       (unsigned long long)gaps, busy_poll_read);
	return 0;
}

/* ---------------------------------------------------------------------------- rate mode */

static int run_rate(const struct opts *o)
{
	uint64_t cap = (uint64_t)((o->duration + o->warmup) * o->rate) + BATCH + 16;
	uint8_t *seen = calloc(cap / 8 + 1, 1);
	static uint8_t bufs[BATCH][2048];
	static uint8_t rbufs[BATCH][2048];
	struct mmsghdr mm[BATCH], rm[BATCH];
	struct iovec iov[BATCH], riov[BATCH];
	int fd = make_socket(o, 0);
	int64_t start, end, tick, deadline;
	uint64_t sent = 0, got = 0, dup = 0, unknown = 0, send_err = 0, i;
	int size = o->size > 2048 ? 2048 : o->size;

	if (!seen)
		die("calloc");
	place_self(o);
	memset(mm, 0, sizeof(mm));
	memset(rm, 0, sizeof(rm));
	for (i = 0; i < BATCH; i++) {
		memset(bufs[i], 0, sizeof(bufs[i]));
		iov[i].iov_base = bufs[i];
		iov[i].iov_len = size;
		mm[i].msg_hdr.msg_iov = &iov[i];
		mm[i].msg_hdr.msg_iovlen = 1;
		riov[i].iov_base = rbufs[i];
		riov[i].iov_len = sizeof(rbufs[i]);
		rm[i].msg_hdr.msg_iov = &riov[i];
		rm[i].msg_hdr.msg_iovlen = 1;
	}
	/* tick: at most 20 us between batches, at least one packet per tick */
	tick = (int64_t)(1e9 / o->rate);
	if (tick > 20000)
		tick = 20000;
	start = now_ns();
	end = start + (int64_t)(o->duration * 1e9);
	while (!stop_now) {
		int64_t t = now_ns();
		uint64_t due, n;
		int k, r;

		if (t >= end)
			break;
		due = (uint64_t)((t - start) * 1e-9 * o->rate) + 1;
		if (due > cap - BATCH)
			due = cap - BATCH;
		while (sent < due) {
			n = due - sent;
			if (n > BATCH)
				n = BATCH;
			for (k = 0; k < (int)n; k++)
				put_header(bufs[k], sent + k, FLAG_CLIENT | FLAG_PONG, (uint32_t)size);
			r = sendmmsg(fd, mm, (unsigned int)n, 0);
			if (r <= 0) {
				send_err++;
				break; /* ENOBUFS: the device queue pushed back; retry next tick */
			}
			sent += r;
		}
		/* drain replies, then sleep until the next tick */
		for (;;) {
			r = recvmmsg(fd, rm, BATCH, MSG_DONTWAIT, NULL);
			if (r <= 0)
				break;
			for (k = 0; k < r; k++) {
				uint64_t seq;

				if (rm[k].msg_len < HDR_LEN)
					continue;
				seq = get_seq(rbufs[k]);
				if (seq >= sent) {
					unknown++;
					continue;
				}
				if (seen[seq / 8] & (1u << (seq % 8))) {
					dup++;
					continue;
				}
				seen[seq / 8] |= 1u << (seq % 8);
				got++;
			}
		}
		{
			struct pollfd p = { .fd = fd, .events = POLLIN };
			int64_t wait = tick - (now_ns() - t);
			struct timespec to = { 0, wait > 0 ? wait : 0 };

			ppoll(&p, 1, &to, NULL);
		}
	}
	{
		double elapsed = (now_ns() - start) / 1e9;

		deadline = now_ns() + (int64_t)(o->grace * 1e9);
		while (now_ns() < deadline && got < sent) {
			struct pollfd p = { .fd = fd, .events = POLLIN };
			int r = recvmmsg(fd, rm, BATCH, MSG_DONTWAIT, NULL);
			int k;

			if (r <= 0) {
				poll(&p, 1, 10);
				continue;
			}
			for (k = 0; k < r; k++) {
				uint64_t seq = get_seq(rbufs[k]);

				if (seq < sent && !(seen[seq / 8] & (1u << (seq % 8)))) {
					seen[seq / 8] |= 1u << (seq % 8);
					got++;
				}
			}
		}
		printf("{\"mode\": \"rate\", \"target_pps\": %.1f, \"sent\": %llu, \"received\": %llu, "
		       "\"lost\": %llu, \"duplicates\": %llu, \"unknown\": %llu, \"send_errors\": %llu, "
		       "\"elapsed_s\": %.6f, \"achieved_pps\": %.1f, \"interrupted\": %s, "
		       "\"so_busy_poll_us\": %d}\n",
		       o->rate, (unsigned long long)sent, (unsigned long long)got,
		       (unsigned long long)(sent - got), (unsigned long long)dup,
		       (unsigned long long)unknown, (unsigned long long)send_err, elapsed,
		       sent / (elapsed > 0 ? elapsed : 1), stop_now ? "true" : "false",
		       busy_poll_read);
	}
	return 0;
}

static void usage(void)
{
	fprintf(stderr,
		"usage: kbp-rtt --ip IP [--port P] [--size BYTES] [--rate PPS] [--poisson]\n"
		"               [--uniform MIN_US,MAX_US] [--duration S] [--warmup S]\n"
		"               [--grace S] [--cpu N] [--fifo PRIO]\n"
		"               [--out FILE] [--mode rtt|rate] [--seed N]\n");
	exit(2);
}

int main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "ip", required_argument, 0, 'i' },     { "port", required_argument, 0, 'p' },
		{ "size", required_argument, 0, 's' },   { "rate", required_argument, 0, 'r' },
		{ "poisson", no_argument, 0, 'P' },      { "duration", required_argument, 0, 't' },
		{ "warmup", required_argument, 0, 'w' }, { "grace", required_argument, 0, 'g' },
		{ "cpu", required_argument, 0, 'c' },    { "fifo", required_argument, 0, 'f' },
		{ "out", required_argument, 0, 'o' },    { "mode", required_argument, 0, 'm' },
		{ "seed", required_argument, 0, 'S' },   { "uniform", required_argument, 0, 'U' },
		{ 0, 0, 0, 0 },
	};
	struct opts o = { .port = 11111, .size = 18, .rate = 1000, .duration = 5, .warmup = 0.5,
			  .grace = 0.5, .cpu = -1, .mode = "rtt", .seed = 1 };
	struct sigaction sa = { .sa_handler = on_signal };
	int c;

	while ((c = getopt_long(argc, argv, "i:p:s:r:Pt:w:g:c:f:o:m:S:U:", lo, NULL)) != -1) {
		switch (c) {
		case 'i': o.ip = optarg; break;
		case 'p': o.port = atoi(optarg); break;
		case 's': o.size = atoi(optarg); break;
		case 'r': o.rate = atof(optarg); break;
		case 'P': o.poisson = 1; break;
		case 't': o.duration = atof(optarg); break;
		case 'w': o.warmup = atof(optarg); break;
		case 'g': o.grace = atof(optarg); break;
		case 'c': o.cpu = atoi(optarg); break;
		case 'f': o.fifo = atoi(optarg); break;
		case 'o': o.out = optarg; break;
		case 'm': o.mode = optarg; break;
		case 'S': o.seed = strtoull(optarg, NULL, 0); break;
		case 'U':
			if (parse_uniform(optarg, &o.uni_min_us, &o.uni_max_us)) {
				fprintf(stderr, "kbp-rtt: bad --uniform %s: use MIN_US,MAX_US with "
					"0 < MIN_US <= MAX_US\n", optarg);
				exit(2);
			}
			break;
		default: usage();
		}
	}
	if (o.uni_max_us > 0) {
		if (o.poisson || strcmp(o.mode, "rtt")) {
			fprintf(stderr, "kbp-rtt: --uniform is for --mode rtt, without --poisson\n");
			exit(2);
		}
		/* the mean rate sizes the sample slots and is what the summary says */
		o.rate = 2e6 / (o.uni_min_us + o.uni_max_us);
	}
	if (!o.ip || o.size < HDR_LEN || o.size > MAX_MSG || o.rate <= 0 || o.duration <= 0)
		usage();
	rng_state ^= o.seed * 0x9E3779B97F4A7C15ULL;
	if (!rng_state)
		rng_state = 1;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);
	if (!strcmp(o.mode, "rtt"))
		return run_rtt(&o);
	if (!strcmp(o.mode, "rate"))
		return run_rate(&o);
	usage();
	return 2;
}
