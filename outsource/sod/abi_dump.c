// SPDX-License-Identifier: GPL-2.0-only
/* Prints the ABI's layout as JSON: the Python test client checks its own against it. */
#include <stddef.h>
#include <stdio.h>

#include "kbp_so_abi.h"

#define F(s, f) printf("%s\"%s.%s\": [%zu, %zu]", first ? "" : ",\n ", #s, #f, \
		       offsetof(struct s, f), sizeof(((struct s *)0)->f)), first = 0

int main(void)
{
	int first = 1;

	printf("{");
	F(kbp_so_header, magic); F(kbp_so_header, version_major);
	F(kbp_so_header, version_minor); F(kbp_so_header, header_size);
	F(kbp_so_header, region_size); F(kbp_so_header, epoch);
	F(kbp_so_header, host_state); F(kbp_so_header, nr_queues);
	F(kbp_so_header, ring_entries); F(kbp_so_header, queue_offset);
	F(kbp_so_header, queue_stride); F(kbp_so_header, host_features);
	F(kbp_so_header, heartbeat); F(kbp_so_header, max_sockets);
	F(kbp_so_header, max_segs); F(kbp_so_header, host_ack_gen);
	F(kbp_so_header, guest_features); F(kbp_so_header, guest_state);
	F(kbp_so_header, guest_gen); F(kbp_so_header, guest_epoch);
	F(kbp_so_queue_ctl, sq_tail); F(kbp_so_queue_ctl, cq_head);
	F(kbp_so_queue_ctl, need_irq); F(kbp_so_queue_ctl, sq_head);
	F(kbp_so_queue_ctl, cq_tail); F(kbp_so_queue_ctl, host_polling);
	F(kbp_so_queue_ctl, host_error); F(kbp_so_queue_ctl, inflight);
	F(kbp_so_queue_ctl, requests); F(kbp_so_queue_ctl, completions);
	F(kbp_so_queue_ctl, rejects); F(kbp_so_queue_ctl, bytes_in);
	F(kbp_so_queue_ctl, bytes_out); F(kbp_so_queue_ctl, copies);
	F(kbp_so_queue_ctl, irqs); F(kbp_so_queue_ctl, doorbells);
	F(kbp_so_addr, family); F(kbp_so_addr, port); F(kbp_so_addr, flowinfo);
	F(kbp_so_addr, addr); F(kbp_so_addr, scope_id);
	F(kbp_so_seg, gpa); F(kbp_so_seg, len);
	F(kbp_so_sqe, tag); F(kbp_so_sqe, op); F(kbp_so_sqe, nr_segs);
	F(kbp_so_sqe, flags); F(kbp_so_sqe, sock); F(kbp_so_sqe, msg_flags);
	F(kbp_so_sqe, arg0); F(kbp_so_sqe, arg1); F(kbp_so_sqe, addr);
	F(kbp_so_sqe, opt); F(kbp_so_sqe, reserved); F(kbp_so_sqe, seg);
	F(kbp_so_cqe, tag); F(kbp_so_cqe, res); F(kbp_so_cqe, sock);
	F(kbp_so_cqe, msg_len); F(kbp_so_cqe, out_flags); F(kbp_so_cqe, epoch);
	F(kbp_so_cqe, op); F(kbp_so_cqe, addr);
	F(kbp_so_rxmeta, dst); F(kbp_so_rxmeta, tstamp_ns); F(kbp_so_rxmeta, drops);
	F(kbp_so_rxmeta, tos); F(kbp_so_rxmeta, ttl); F(kbp_so_rxmeta, valid);
	F(kbp_so_rxmeta, reserved);
	printf(",\n \"sizeof.rxmeta\": [0, %zu]", sizeof(struct kbp_so_rxmeta));
	printf(",\n \"const.MINOR\": [0, %d]", KBP_SO_VERSION_MINOR);
	printf(",\n \"const.FEAT_META\": [0, %llu]", (unsigned long long)KBP_SO_FEAT_META);
	printf(",\n \"const.FEAT_QUEUE_OPTS\": [0, %llu]",
	       (unsigned long long)KBP_SO_FEAT_QUEUE_OPTS);
	printf(",\n \"const.F_META\": [0, %lu]", (unsigned long)KBP_SO_F_META);
	printf(",\n \"const.MSG_SRC\": [0, %lu]", (unsigned long)KBP_SO_MSG_SRC);
	printf(",\n \"const.MSG_TOS\": [0, %lu]", (unsigned long)KBP_SO_MSG_TOS);
	printf(",\n \"const.OPT_INQ\": [0, %d]", KBP_SO_OPT_INQ);
	printf(",\n \"const.OPT_OUTQ\": [0, %d]", KBP_SO_OPT_OUTQ);
	printf(",\n \"const.META_VALID\": [0, %lu]", (unsigned long)(KBP_SO_META_DST |
	       KBP_SO_META_TSTAMP | KBP_SO_META_DROPS | KBP_SO_META_TOS | KBP_SO_META_TTL));
	printf(",\n \"sizeof.header\": [0, %zu]", sizeof(struct kbp_so_header));
	printf(",\n \"sizeof.queue_ctl\": [0, %zu]", sizeof(struct kbp_so_queue_ctl));
	printf(",\n \"sizeof.sqe\": [0, %zu]", sizeof(struct kbp_so_sqe));
	printf(",\n \"sizeof.cqe\": [0, %zu]", sizeof(struct kbp_so_cqe));
	printf(",\n \"const.QCTL_SIZE\": [0, %d]", KBP_SO_QCTL_SIZE);
	printf(",\n \"const.MAGIC_LO\": [0, %u]", (unsigned int)(KBP_SO_MAGIC & 0xffffffffu));
	printf(",\n \"const.MAJOR\": [0, %d]", KBP_SO_VERSION_MAJOR);
	printf("}\n");
	return 0;
}
