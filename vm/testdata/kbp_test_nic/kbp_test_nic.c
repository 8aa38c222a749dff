// SPDX-License-Identifier: GPL-2.0
/*
 * kbp_test_nic: a test-only network device for the kbp VM suite that behaves
 * like the real NIC drivers kbp meets in the field, not like virtio-net and
 * veth.  Debian builds no netdevsim, so this is the rig's stand-in.
 * devices=N devices per load ("ktn0", "ktn1", ...: param name), the ports of
 * one adapter: each has its own queues, NAPIs and reset work, and
 * adapter_reset resets them all at once.
 *
 * Traffic is made inside the guest: each RX queue has a "hardware" ring fed
 * by an hrtimer pinned to the queue's interrupt CPU (param cpus), which then
 * schedules the queue's NAPI from hardIRQ context, as a NIC's MSI-X vector
 * does.  Every frame carries its queue and a sequence number; a packet_type
 * handler counts what arrives, the gaps and the reorders, and in which
 * context it was polled (kbp's poller or the softirq).  Frames still in a
 * ring when its queue is torn down are counted as the driver's own drops,
 * so "gaps == ring_dropped, reorders == 0" is what a correct poller gives.
 *
 * Modes (params), and the drivers they imitate:
 *   queues=N      N RX queues, one NAPI each (ice, i40e, mlx5, bnxt: one
 *                 NAPI per MSI-X vector), each scheduled from its own CPU.
 *   ethtool -L    combined N: the NAPIs are deleted and added again under
 *                 rtnl while the device stays up (mlx4, i40e, virtio-net).
 *   reset         writing N to /sys/class/net/ktn0/ktn/reset runs N resets
 *                 from a workqueue WITHOUT rtnl and without NETDEV_GOING_DOWN:
 *                 napi_disable(), netif_napi_del() and kfree() of every queue
 *                 vector, then new ones (ice's ice_reset_subtask() ->
 *                 ice_rebuild() -> ice_vsi_rebuild(), igc/ixgbe resets).
 *   percpu=1      one NAPI per possible CPU, gro_cells style (vxlan, geneve,
 *                 gre, ipip, ip6tnl): fed from BH context on its own CPU with
 *                 an unlocked __skb_queue_tail() and marked
 *                 NAPI_STATE_NO_BUSY_POLL, so it must never be polled from
 *                 another CPU.
 *   reverse=1     the NAPIs are added last queue first, so their order on
 *                 dev->napi_list is not their queues' (the queue a NAPI
 *                 serves is told with netif_queue_set_napi(), 6.10+, as
 *                 ice, mlx5 and bnxt do; under rtnl, which the reset path
 *                 takes just for that, as ice_vsi_rebuild() does).
 *   ops_lock=1    (7.x) request_ops_lock: the core runs the ops under the
 *                 instance lock (mlx5, bnxt, gve, fbnic and netdevsim).
 *   adapter_reset writing N runs N resets of every port at once, each from
 *                 its own work item on the unbound workqueue (ice: one
 *                 adapter-wide reset makes every PF's reset work delete
 *                 and re-add its NAPIs, concurrently, without rtnl).
 *   tx_napi=1     a TX-only NAPI (netif_napi_add_tx(): NO_BUSY_POLL) added
 *                 after each RX queue's, so the device's NAPIs in add order
 *                 are rx0, tx0, rx1, tx1, ... (virtio-net), and with
 *                 queue_napi=0 the driver does not say which RX queue each
 *                 serves (Debian 12's virtio-net).
 *   percpu_busy_poll=1  with percpu=1: the per-CPU NAPIs do not set
 *                 NO_BUSY_POLL (mvneta: this_cpu_ptr(pp->ports)), so nothing
 *                 tells kbp they must run on their own CPU; each records a
 *                 frame polled on another CPU (stats: foreign).
 *
 *   cost_ns=N     each frame costs the receiving context N ns of CPU (a
 *                 busy wait in the handler): a heavy flow's protocol work,
 *                 for the RT/non-RT split measurements.
 *
 * Stats: /sys/class/net/ktn0/ktn/stats, one line per queue index used.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include <linux/etherdevice.h>
#include <linux/ethtool.h>
#include <linux/hrtimer.h>
#include <linux/module.h>
#include <linux/mutex.h>
#include <linux/netdevice.h>
#include <linux/rtnetlink.h>
#include <linux/sched/clock.h>
#include <linux/slab.h>
#include <linux/workqueue.h>

#define KTN_MAX_QUEUES	64
#define KTN_RING	512
#define KTN_BURST	64
#define KTN_MAGIC	0x6b74
#define KTN_ETH_P	ETH_P_802_EX1

static char *name = "ktn%d";
module_param(name, charp, 0444);
MODULE_PARM_DESC(name, "interface name (default ktn%d)");

static unsigned int queues = 2;
module_param(queues, uint, 0444);
MODULE_PARM_DESC(queues, "RX queues at load (1-64, default 2); ethtool -L changes it");

static unsigned int rate = 1000;
module_param(rate, uint, 0644);
MODULE_PARM_DESC(rate, "frames per second per queue (0: none; default 1000)");

static unsigned int cost_ns;
module_param(cost_ns, uint, 0644);
MODULE_PARM_DESC(cost_ns, "CPU time the stack spends on each frame, busy-waited in the receive handler (a heavy flow's protocol work; 0-1000000, default 0)");

static int cpus[KTN_MAX_QUEUES];
static int nr_cpus;
module_param_array(cpus, int, &nr_cpus, 0444);
MODULE_PARM_DESC(cpus, "interrupt CPU of queue i (default: i modulo the online CPUs)");

static bool percpu;
module_param(percpu, bool, 0444);
MODULE_PARM_DESC(percpu, "gro_cells-style per-CPU NAPIs with NO_BUSY_POLL (default 0)");

static bool reverse;
module_param(reverse, bool, 0444);
MODULE_PARM_DESC(reverse, "add the queues' NAPIs last queue first (default 0)");

static bool queue_napi = true;
module_param(queue_napi, bool, 0444);
MODULE_PARM_DESC(queue_napi, "tell the core which queue each NAPI serves (6.10+; default 1); 0: a driver that does not, whose reset then takes no rtnl at all");

static bool ops_lock;
module_param(ops_lock, bool, 0444);
MODULE_PARM_DESC(ops_lock, "request the instance lock for the ops (7.x request_ops_lock)");

#define KTN_MAX_DEVS	4
static unsigned int devices = 1;
module_param(devices, uint, 0444);
MODULE_PARM_DESC(devices, "ports of the adapter, one net_device each (1-4, default 1)");

static bool tx_napi;
module_param(tx_napi, bool, 0444);
MODULE_PARM_DESC(tx_napi, "a TX-only NAPI after each RX queue's (virtio-net's order; default 0)");

static bool percpu_busy_poll;
module_param(percpu_busy_poll, bool, 0444);
MODULE_PARM_DESC(percpu_busy_poll, "percpu=1 without NO_BUSY_POLL (mvneta; default 0)");

static int irq = -1;
module_param(irq, int, 0444);
MODULE_PARM_DESC(irq, "6.10+: say (netif_napi_set_irq()) that every RX NAPI's interrupt is this existing IRQ, whose affinity then places it (default -1: none)");

/* One frame's payload, after the Ethernet header. */
struct ktn_hdr {
	__be16 magic;
	__be16 queue;
	__be64 seq;
} __packed;

/*
 * What survives a queue vector: the ring's positions and the receiver's
 * view of queue index i.  produced/consumed: the ring (written by the
 * timer and by the poll respectively; the reset path writes both with
 * both stopped).  The receiver's fields are written by whoever polls the
 * queue's NAPI: one at a time, NAPI_STATE_SCHED being the lock.
 */
struct ktn_ring {
	u64 produced;
	u64 consumed;
	u64 ring_dropped;	/* in the ring when the queue was torn down */
	u64 missed;		/* the ring was full: never numbered */
	/* receiver */
	u64 delivered;
	u64 expect;
	u64 gaps;
	u64 reorders;
	u64 by_kbp;		/* by a kbp poller of either class */
	u64 by_kbpn;		/* of them, by a non-rt one (kbpn/N) */
	u64 by_softirq;
	u64 by_other;
	u64 foreign;		/* percpu: polled on another CPU than its own */
	int rx_cpu;		/* where the last frame was received */
	int cpu;
	bool used;
};

struct ktn_priv;

/* A queue vector: freed and allocated again by every reconfiguration. */
struct ktn_queue {
	struct napi_struct napi;
	struct napi_struct tx;		/* tx_napi: TX-only, never scheduled */
	struct hrtimer timer;
	struct ktn_priv *priv;
	struct ktn_ring *ring;
	struct sk_buff_head cell;	/* percpu mode: gro_cells' queue */
	unsigned int index;
	int cpu;
	bool soft;			/* timer in BH context (percpu mode) */
};

struct ktn_priv {
	struct net_device *dev;
	struct mutex cfg_lock;		/* the driver's own: queues[], nq */
	struct ktn_queue *q[KTN_MAX_QUEUES];
	unsigned int nq;		/* queues while up */
	unsigned int want;		/* queues asked for (ethtool -L) */
	bool up;
	bool no_rtnl;			/* the reset path: rtnl not held */
	struct work_struct reset_work;
	atomic_t resets_pending;
	unsigned int resets;		/* done, under cfg_lock */
	struct ktn_ring rings[KTN_MAX_QUEUES];
};

static struct net_device *ktn_devs[KTN_MAX_DEVS];
static unsigned int ktn_nr_devs;
static DEFINE_MUTEX(ktn_devs_lock);	/* ktn_devs[] against adapter_reset */
static const struct net_device_ops ktn_netdev_ops;

static u64 ktn_period_ns(void)
{
	unsigned int r = READ_ONCE(rate);

	return r ? NSEC_PER_SEC / r : NSEC_PER_SEC;
}

static struct sk_buff *ktn_frame(struct ktn_priv *priv, struct napi_struct *napi,
				 unsigned int queue, u64 seq)
{
	struct net_device *dev = priv->dev;
	struct ktn_hdr *h;
	struct ethhdr *eth;
	struct sk_buff *skb;

	skb = napi ? napi_alloc_skb(napi, ETH_HLEN + sizeof(*h) + 32) :
		     alloc_skb(NET_IP_ALIGN + ETH_HLEN + sizeof(*h) + 32, GFP_ATOMIC);
	if (!skb)
		return NULL;
	if (!napi)
		skb_reserve(skb, NET_IP_ALIGN);
	eth = skb_put(skb, ETH_HLEN);
	ether_addr_copy(eth->h_dest, dev->dev_addr);
	eth_zero_addr(eth->h_source);
	eth->h_source[0] = 0x02;
	eth->h_proto = htons(KTN_ETH_P);
	h = skb_put(skb, sizeof(*h));
	h->magic = htons(KTN_MAGIC);
	h->queue = htons(queue);
	h->seq = cpu_to_be64(seq);
	skb_put_zero(skb, 32);
	skb->protocol = eth_type_trans(skb, dev);
	skb_record_rx_queue(skb, queue);
	return skb;
}

/* --- the "hardware": one timer per queue on its interrupt CPU ------------ */

static void ktn_produce(struct ktn_queue *q, u64 n)
{
	struct ktn_ring *r = q->ring;
	u64 room = KTN_RING - (r->produced - READ_ONCE(r->consumed));

	if (n > room) {
		r->missed += n - room;
		n = room;
	}
	/* the frames before the "interrupt" (pairs with the poll's acquire) */
	smp_store_release(&r->produced, r->produced + n);
}

static enum hrtimer_restart ktn_timer_fn(struct hrtimer *t)
{
	struct ktn_queue *q = container_of(t, struct ktn_queue, timer);
	u64 n = hrtimer_forward_now(t, ns_to_ktime(ktn_period_ns()));

	if (READ_ONCE(rate)) {
		if (q->soft) {
			/* gro_cells_receive(): BH context, own CPU, no lock */
			struct ktn_ring *r = q->ring;
			struct sk_buff *skb;

			for (n = min_t(u64, n, KTN_BURST); n; n--) {
				if (skb_queue_len(&q->cell) >= KTN_RING) {
					r->missed++;
					continue;
				}
				skb = ktn_frame(q->priv, NULL, q->index, r->produced);
				if (!skb)
					break;
				r->produced++;
				__skb_queue_tail(&q->cell, skb);
			}
			napi_schedule(&q->napi);
		} else {
			ktn_produce(q, min_t(u64, n, KTN_BURST));
			napi_schedule_irqoff(&q->napi);
		}
	}
	return HRTIMER_RESTART;
}

static void ktn_timer_start_here(void *arg)
{
	struct ktn_queue *q = arg;

	hrtimer_start(&q->timer, ns_to_ktime(ktn_period_ns()),
		      q->soft ? HRTIMER_MODE_REL_PINNED_SOFT :
				HRTIMER_MODE_REL_PINNED_HARD);
}

static void ktn_timer_start(struct ktn_queue *q)
{
	if (cpu_online(q->cpu) &&
	    !smp_call_function_single(q->cpu, ktn_timer_start_here, q, 1))
		return;
	ktn_timer_start_here(q);
}

/* --- the driver's poll ----------------------------------------------------- */

static int ktn_poll(struct napi_struct *napi, int budget)
{
	struct ktn_queue *q = container_of(napi, struct ktn_queue, napi);
	struct ktn_ring *r = q->ring;
	struct sk_buff *skb;
	int done = 0;

	while (done < budget) {
		if (q->soft) {
			if (smp_processor_id() != q->cpu)
				r->foreign++;
			skb = __skb_dequeue(&q->cell);
			if (!skb)
				break;
		} else {
			/* the frames before produced (ktn_produce()'s release) */
			if (r->consumed == smp_load_acquire(&r->produced))
				break;
			skb = ktn_frame(q->priv, napi, q->index, r->consumed);
			if (!skb)
				break;
			WRITE_ONCE(r->consumed, r->consumed + 1);
		}
		napi_gro_receive(napi, skb);
		done++;
	}
	if (done < budget)
		napi_complete_done(napi, done);
	return done;
}

/* tx_napi: a TX-only NAPI, nothing to clean (it is never scheduled anyway). */
static int ktn_tx_poll(struct napi_struct *napi, int budget)
{
	napi_complete_done(napi, 0);
	return 0;
}

/* Burn @ns of CPU in the receiving context, as protocol processing would. */
static void ktn_spend(unsigned int ns)
{
	u64 end;

	if (!ns)
		return;
	end = local_clock() + ns;
	while (local_clock() < end)
		cpu_relax();
}

/* The stack's side: count what arrives, in order or not, and where. */
static int ktn_rcv(struct sk_buff *skb, struct net_device *dev,
		   struct packet_type *pt, struct net_device *orig_dev)
{
	struct ktn_priv *priv;
	struct ktn_hdr *h;
	struct ktn_ring *r;
	unsigned int qi;
	u64 seq;

	if (dev->netdev_ops != &ktn_netdev_ops || !pskb_may_pull(skb, sizeof(*h)))
		goto out;
	h = (struct ktn_hdr *)skb->data;
	qi = ntohs(h->queue);
	if (h->magic != htons(KTN_MAGIC) || qi >= KTN_MAX_QUEUES)
		goto out;
	priv = netdev_priv(dev);
	r = &priv->rings[qi];
	seq = be64_to_cpu(h->seq);
	if (seq > r->expect)
		r->gaps += seq - r->expect;
	else if (seq < r->expect)
		r->reorders++;
	if (seq >= r->expect)
		r->expect = seq + 1;
	r->delivered++;
	r->rx_cpu = smp_processor_id();
	ktn_spend(min(READ_ONCE(cost_ns), 1000000U));
	if (in_serving_softirq()) {
		r->by_softirq++;
	} else if (!strncmp(current->comm, "kbp/", 4)) {
		r->by_kbp++;
	} else if (!strncmp(current->comm, "kbpn/", 5)) {
		r->by_kbp++;
		r->by_kbpn++;
	} else {
		r->by_other++;
	}
out:
	consume_skb(skb);
	return NET_RX_SUCCESS;
}

static struct packet_type ktn_pt __read_mostly = {
	.type = htons(KTN_ETH_P),
	.func = ktn_rcv,
};

/* --- queue vectors: build and tear down ------------------------------------ */

static int ktn_queue_cpu(unsigned int i)
{
	if (percpu)
		return i;
	if (i < nr_cpus && cpus[i] >= 0 && cpus[i] < nr_cpu_ids)
		return cpus[i];
	return i % num_online_cpus();
}

static void ktn_timer_init(struct ktn_queue *q)
{
	enum hrtimer_mode mode = q->soft ? HRTIMER_MODE_REL_PINNED_SOFT :
					   HRTIMER_MODE_REL_PINNED_HARD;
#ifdef KTN_HAVE_HRTIMER_SETUP
	hrtimer_setup(&q->timer, ktn_timer_fn, CLOCK_MONOTONIC, mode);
#else
	hrtimer_init(&q->timer, CLOCK_MONOTONIC, mode);
	q->timer.function = ktn_timer_fn;
#endif
}

/*
 * Tell the core which RX queue each NAPI serves (6.10+), or that none does.
 * Under rtnl: held by open, stop and set_channels; the reset path does it
 * before and after its work without rtnl (ktn_reset_fn()), taking rtnl
 * then, like ice.  Not for the per-CPU NAPIs, which serve no queue.
 */
static void ktn_queues_set_napi(struct ktn_priv *priv, bool set)
{
#ifdef KTN_HAVE_QUEUE_NAPI
	unsigned int i;

	if (percpu || priv->no_rtnl || !queue_napi)
		return;
	for (i = 0; i < priv->nq; i++)
		netif_queue_set_napi(priv->dev, i, NETDEV_QUEUE_TYPE_RX,
				     set ? &priv->q[i]->napi : NULL);
#endif
}

/*
 * The NAPI calls: an ops-locked device (7.x) runs open, stop and
 * set_channels under its instance lock, and its reset takes it: the
 * *_locked variants then.
 */
#ifdef KTN_HAVE_OPS_LOCK
static void ktn_napi_add(struct net_device *dev, struct napi_struct *n)
{
	if (ops_lock)
		netif_napi_add_locked(dev, n, ktn_poll);
	else
		netif_napi_add(dev, n, ktn_poll);
}

static void ktn_napi_enable(struct napi_struct *n)
{
	if (ops_lock)
		napi_enable_locked(n);
	else
		napi_enable(n);
}

static void ktn_napi_disable(struct napi_struct *n)
{
	if (ops_lock)
		napi_disable_locked(n);
	else
		napi_disable(n);
}

static void ktn_napi_del(struct napi_struct *n)
{
	if (ops_lock)
		netif_napi_del_locked(n);
	else
		netif_napi_del(n);
}
#else
#define ktn_napi_add(dev, n)	netif_napi_add(dev, n, ktn_poll)
#define ktn_napi_enable(n)	napi_enable(n)
#define ktn_napi_disable(n)	napi_disable(n)
#define ktn_napi_del(n)		netif_napi_del(n)
#endif

/* cfg_lock held; rtnl held or not (the reset path has none) */
static int ktn_queues_up(struct ktn_priv *priv)
{
	unsigned int i, j, n = percpu ? min_t(unsigned int, nr_cpu_ids, KTN_MAX_QUEUES) :
					priv->want;
	struct ktn_queue *q;

	for (j = 0; j < n; j++) {
		i = reverse ? n - 1 - j : j;
		q = kzalloc(sizeof(*q), GFP_KERNEL);
		if (!q)
			goto err;
		q->priv = priv;
		q->index = i;
		q->ring = &priv->rings[i];
		q->cpu = ktn_queue_cpu(i);
		q->soft = percpu;
		q->ring->used = true;
		q->ring->cpu = q->cpu;
		skb_queue_head_init(&q->cell);
		ktn_timer_init(q);
		ktn_napi_add(priv->dev, &q->napi);
#ifdef KTN_HAVE_NAPI_IRQ
		if (irq >= 0)
			netif_napi_set_irq(&q->napi, irq);
#endif
		if (percpu && !percpu_busy_poll)	/* as gro_cells_init() */
			set_bit(NAPI_STATE_NO_BUSY_POLL, &q->napi.state);
		if (tx_napi)	/* virtio-net's order: rx0, tx0, rx1, ... */
			netif_napi_add_tx(priv->dev, &q->tx, ktn_tx_poll);
		priv->q[i] = q;
	}
	priv->nq = n;
	ktn_queues_set_napi(priv, true);
	for (i = 0; i < n; i++) {
		ktn_napi_enable(&priv->q[i]->napi);
		if (tx_napi)
			napi_enable(&priv->q[i]->tx);
	}
	for (i = 0; i < n; i++)
		if (!percpu || cpu_online(i))
			ktn_timer_start(priv->q[i]);
	return 0;
err:
	for (i = 0; i < n; i++) {
		if (!priv->q[i])
			continue;
		if (tx_napi)
			netif_napi_del(&priv->q[i]->tx);
		ktn_napi_del(&priv->q[i]->napi);
		kfree(priv->q[i]);
		priv->q[i] = NULL;
	}
	return -ENOMEM;
}

/*
 * Stop the "hardware", then napi_disable(), netif_napi_del() (which waits
 * for an RCU grace period) and kfree() each vector: the order of ice's
 * ice_vsi_decfg().  cfg_lock held.
 */
static void ktn_queues_down(struct ktn_priv *priv)
{
	unsigned int i;

	for (i = 0; i < priv->nq; i++)
		hrtimer_cancel(&priv->q[i]->timer);
	ktn_queues_set_napi(priv, false);
	for (i = 0; i < priv->nq; i++) {
		ktn_napi_disable(&priv->q[i]->napi);
		if (tx_napi)
			napi_disable(&priv->q[i]->tx);
	}
	for (i = 0; i < priv->nq; i++) {
		struct ktn_queue *q = priv->q[i];
		struct ktn_ring *r = q->ring;

		r->ring_dropped += r->produced - r->consumed + skb_queue_len(&q->cell);
		r->consumed = r->produced;
		__skb_queue_purge(&q->cell);
		if (tx_napi)
			netif_napi_del(&q->tx);
		ktn_napi_del(&q->napi);
		kfree(q);
		priv->q[i] = NULL;
	}
	priv->nq = 0;
}

static void ktn_ops_lock(struct net_device *dev)
{
#ifdef KTN_HAVE_OPS_LOCK
	if (ops_lock)
		netdev_lock(dev);
#endif
}

static void ktn_ops_unlock(struct net_device *dev)
{
#ifdef KTN_HAVE_OPS_LOCK
	if (ops_lock)
		netdev_unlock(dev);
#endif
}

/* The reset path's queue <-> NAPI association, under rtnl (then cfg_lock). */
static void ktn_reset_queue_napi(struct ktn_priv *priv, bool set)
{
	if (ops_lock || !queue_napi)	/* rtnl throughout, or not at all */
		return;
	/* rtnl, then cfg_lock: the order of open, stop and set_channels */
	rtnl_lock();
	mutex_lock(&priv->cfg_lock);
	if (priv->up)
		ktn_queues_set_napi(priv, set);
	mutex_unlock(&priv->cfg_lock);
	rtnl_unlock();
}

/*
 * The reset: no NETDEV_GOING_DOWN, the device stays up, and without rtnl
 * (ice) except for an ops-locked device, whose reset holds rtnl and then its
 * instance lock throughout (the core's order; cfg_lock after rtnl always).
 */
static void ktn_reset_fn(struct work_struct *work)
{
	struct ktn_priv *priv = container_of(work, struct ktn_priv, reset_work);

	while (atomic_read(&priv->resets_pending) > 0) {
		ktn_reset_queue_napi(priv, false);
		if (ops_lock)
			rtnl_lock();
		mutex_lock(&priv->cfg_lock);
		if (priv->up) {
			priv->no_rtnl = !ops_lock;
			ktn_ops_lock(priv->dev);
			ktn_queues_down(priv);
			if (ktn_queues_up(priv))
				netdev_err(priv->dev, "reset: cannot rebuild the queues\n");
			ktn_ops_unlock(priv->dev);
			priv->no_rtnl = false;
		}
		priv->resets++;
		mutex_unlock(&priv->cfg_lock);
		if (ops_lock)
			rtnl_unlock();
		ktn_reset_queue_napi(priv, true);
		atomic_dec(&priv->resets_pending);
		cond_resched();
	}
}

/* --- netdev and ethtool ops ------------------------------------------------ */

static int ktn_open(struct net_device *dev)
{
	struct ktn_priv *priv = netdev_priv(dev);
	int err;

	mutex_lock(&priv->cfg_lock);
	err = ktn_queues_up(priv);
	priv->up = !err;
	mutex_unlock(&priv->cfg_lock);
	if (!err)
		netif_carrier_on(dev);
	return err;
}

static int ktn_stop(struct net_device *dev)
{
	struct ktn_priv *priv = netdev_priv(dev);

	netif_carrier_off(dev);
	mutex_lock(&priv->cfg_lock);
	priv->up = false;
	ktn_queues_down(priv);
	mutex_unlock(&priv->cfg_lock);
	return 0;
}

static netdev_tx_t ktn_xmit(struct sk_buff *skb, struct net_device *dev)
{
	dev_core_stats_tx_dropped_inc(dev);
	dev_kfree_skb_any(skb);
	return NETDEV_TX_OK;
}

static const struct net_device_ops ktn_netdev_ops = {
	.ndo_open = ktn_open,
	.ndo_stop = ktn_stop,
	.ndo_start_xmit = ktn_xmit,
};

static void ktn_get_channels(struct net_device *dev, struct ethtool_channels *ch)
{
	struct ktn_priv *priv = netdev_priv(dev);

	ch->max_combined = percpu ? 0 : KTN_MAX_QUEUES;
	ch->combined_count = percpu ? 0 : priv->want;
}

/* ethtool -L: the NAPIs go and come back under rtnl, the device stays up. */
static int ktn_set_channels(struct net_device *dev, struct ethtool_channels *ch)
{
	struct ktn_priv *priv = netdev_priv(dev);
	int err = 0;

	if (percpu || !ch->combined_count || ch->combined_count > KTN_MAX_QUEUES ||
	    ch->rx_count || ch->tx_count || ch->other_count)
		return -EINVAL;
	mutex_lock(&priv->cfg_lock);
	priv->want = ch->combined_count;
	if (priv->up) {
		ktn_queues_down(priv);
		err = ktn_queues_up(priv);
		priv->up = !err;
	}
	mutex_unlock(&priv->cfg_lock);
	return err;
}

static const struct ethtool_ops ktn_ethtool_ops = {
	.get_channels = ktn_get_channels,
	.set_channels = ktn_set_channels,
	.get_link = ethtool_op_get_link,
};

/* --- sysfs: /sys/class/net/<dev>/ktn/{stats,reset} -------------------------- */

static ssize_t stats_show(struct device *d, struct device_attribute *attr, char *buf)
{
	struct ktn_priv *priv = netdev_priv(to_net_dev(d));
	unsigned int i;
	int len;

	mutex_lock(&priv->cfg_lock);
	len = sysfs_emit(buf, "resets %u queues %u up %d percpu %d\n", priv->resets,
			 priv->nq, priv->up, percpu);
	for (i = 0; i < KTN_MAX_QUEUES; i++) {
		struct ktn_ring *r = &priv->rings[i];

		if (!r->used)
			continue;
		len += sysfs_emit_at(buf, len,
				     "q%u cpu %d rx_cpu %d produced %llu consumed %llu ring_dropped %llu missed %llu delivered %llu gaps %llu reorders %llu by_kbp %llu by_kbpn %llu by_softirq %llu by_other %llu foreign %llu\n",
				     i, r->cpu, r->rx_cpu, r->produced, r->consumed,
				     r->ring_dropped,
				     r->missed, r->delivered, r->gaps, r->reorders,
				     r->by_kbp, r->by_kbpn, r->by_softirq,
				     r->by_other, r->foreign);
	}
	mutex_unlock(&priv->cfg_lock);
	return len;
}
static DEVICE_ATTR_RO(stats);

static ssize_t reset_store(struct device *d, struct device_attribute *attr,
			   const char *buf, size_t count)
{
	struct ktn_priv *priv = netdev_priv(to_net_dev(d));
	unsigned int n;

	if (kstrtouint(buf, 0, &n) || !n || n > 100000)
		return -EINVAL;
	atomic_add(n, &priv->resets_pending);
	queue_work(system_unbound_wq, &priv->reset_work);
	return count;
}

static ssize_t reset_show(struct device *d, struct device_attribute *attr, char *buf)
{
	struct ktn_priv *priv = netdev_priv(to_net_dev(d));

	return sysfs_emit(buf, "%d\n", atomic_read(&priv->resets_pending));
}
static DEVICE_ATTR_RW(reset);

static struct attribute *ktn_attrs[] = {
	&dev_attr_stats.attr,
	&dev_attr_reset.attr,
	NULL,
};

static const struct attribute_group ktn_group = {
	.name = "ktn",
	.attrs = ktn_attrs,
};

/* --- module ----------------------------------------------------------------- */

/* Queue @n resets of every port, each from its own work item: they run at once. */
static int ktn_adapter_reset_set(const char *val, const struct kernel_param *kp)
{
	unsigned int n, i;

	if (kstrtouint(val, 0, &n) || !n || n > 100000)
		return -EINVAL;
	mutex_lock(&ktn_devs_lock);
	for (i = 0; i < ktn_nr_devs; i++)
		atomic_add(n, &((struct ktn_priv *)netdev_priv(ktn_devs[i]))->resets_pending);
	for (i = 0; i < ktn_nr_devs; i++)
		queue_work(system_unbound_wq,
			   &((struct ktn_priv *)netdev_priv(ktn_devs[i]))->reset_work);
	mutex_unlock(&ktn_devs_lock);
	return 0;
}

/* Resets still pending on every port. */
static int ktn_adapter_reset_get(char *buf, const struct kernel_param *kp)
{
	unsigned int i;
	int pending = 0;

	mutex_lock(&ktn_devs_lock);
	for (i = 0; i < ktn_nr_devs; i++)
		pending += atomic_read(&((struct ktn_priv *)netdev_priv(ktn_devs[i]))->resets_pending);
	mutex_unlock(&ktn_devs_lock);
	return sysfs_emit(buf, "%d\n", pending);
}

static const struct kernel_param_ops ktn_adapter_reset_ops = {
	.set = ktn_adapter_reset_set,
	.get = ktn_adapter_reset_get,
};
module_param_cb(adapter_reset, &ktn_adapter_reset_ops, NULL, 0644);
MODULE_PARM_DESC(adapter_reset, "write N: N resets of every port at once, each from its own work (read: resets pending)");

static struct net_device *ktn_create(void)
{
	struct net_device *dev;
	struct ktn_priv *priv;
	int err;

	dev = alloc_etherdev_mq(sizeof(*priv), KTN_MAX_QUEUES);
	if (!dev)
		return ERR_PTR(-ENOMEM);
	err = dev_alloc_name(dev, name);
	if (err < 0)
		goto err_free;
	priv = netdev_priv(dev);
	priv->dev = dev;
	priv->want = queues;
	mutex_init(&priv->cfg_lock);
	INIT_WORK(&priv->reset_work, ktn_reset_fn);
	dev->netdev_ops = &ktn_netdev_ops;
	dev->ethtool_ops = &ktn_ethtool_ops;
	dev->sysfs_groups[0] = &ktn_group;
	eth_hw_addr_random(dev);
#ifdef KTN_HAVE_OPS_LOCK
	dev->request_ops_lock = ops_lock;
#endif
	netif_carrier_off(dev);
	err = register_netdev(dev);
	if (err)
		goto err_free;
	pr_info("%s: %u queues%s%s%s, %u frames/s per queue\n", dev->name, queues,
		percpu ? ", per-CPU NAPIs (gro_cells)" : "",
		tx_napi ? ", TX NAPIs" : "",
		ops_lock ? ", ops lock" : "", rate);
	return dev;

err_free:
	free_netdev(dev);
	return ERR_PTR(err);
}

static void ktn_destroy(struct net_device *dev)
{
	struct ktn_priv *priv = netdev_priv(dev);

	atomic_set(&priv->resets_pending, 0);
	cancel_work_sync(&priv->reset_work);
	unregister_netdev(dev);
	free_netdev(dev);
}

static int __init ktn_init(void)
{
	struct net_device *dev;
	int err = 0;

	if (!queues || queues > KTN_MAX_QUEUES || !devices || devices > KTN_MAX_DEVS)
		return -EINVAL;
#ifndef KTN_HAVE_OPS_LOCK
	if (ops_lock) {
		pr_err("ops_lock=1: this kernel has no request_ops_lock\n");
		return -EOPNOTSUPP;
	}
#endif
	if (ops_lock && (tx_napi || irq >= 0)) {
		pr_err("tx_napi=1 or irq= with ops_lock=1: not modelled\n");
		return -EINVAL;
	}
	dev_add_pack(&ktn_pt);
	while (ktn_nr_devs < devices) {
		dev = ktn_create();
		if (IS_ERR(dev)) {
			err = PTR_ERR(dev);
			break;
		}
		mutex_lock(&ktn_devs_lock);
		ktn_devs[ktn_nr_devs++] = dev;
		mutex_unlock(&ktn_devs_lock);
	}
	if (!err)
		return 0;
	while (ktn_nr_devs) {
		mutex_lock(&ktn_devs_lock);
		dev = ktn_devs[--ktn_nr_devs];
		mutex_unlock(&ktn_devs_lock);
		ktn_destroy(dev);
	}
	dev_remove_pack(&ktn_pt);
	return err;
}

static void __exit ktn_exit(void)
{
	struct net_device *dev;

	while (ktn_nr_devs) {
		mutex_lock(&ktn_devs_lock);
		dev = ktn_devs[--ktn_nr_devs];
		mutex_unlock(&ktn_devs_lock);
		ktn_destroy(dev);
	}
	dev_remove_pack(&ktn_pt);	/* waits for receivers (synchronize_net) */
}

module_init(ktn_init);
module_exit(ktn_exit);
MODULE_LICENSE("GPL");
MODULE_DESCRIPTION("kbp test NIC: multi-queue, several ports, resets without rtnl, per-CPU NAPIs");
