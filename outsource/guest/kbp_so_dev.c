// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so device: the ivshmem-doorbell device kbp-sod serves.  The
 * region's header check, the queues, the reset handshake and attach, the
 * panic notifier, the dead-host watchdog (heartbeat, failed requests,
 * zombie closes), probe, removal and shutdown, the PCI driver.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

/* The region is the host's: check everything the guest will index with. */
static int kbp_so_check_header(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	u64 end;

	if (READ_ONCE(h->magic) != KBP_SO_MAGIC) {
		pci_info(dev->pdev, "not a kbp-sod region (magic %#llx)\n",
			 READ_ONCE(h->magic));
		return -ENODEV;
	}
	if (READ_ONCE(h->version_major) != KBP_SO_VERSION_MAJOR ||
	    READ_ONCE(h->header_size) != KBP_SO_HEADER_SIZE) {
		pci_err(dev->pdev, "ABI %u.%u, this module speaks %u.x\n",
			READ_ONCE(h->version_major), READ_ONCE(h->version_minor),
			KBP_SO_VERSION_MAJOR);
		return -EPROTONOSUPPORT;
	}
	/* acquire: the host fills the header before it says UP */
	if (smp_load_acquire(&h->host_state) != KBP_SO_HOST_UP) {
		pci_err(dev->pdev, "kbp-sod is not serving this region\n");
		return -ENODEV;
	}
	dev->nr_queues = READ_ONCE(h->nr_queues);
	dev->entries = READ_ONCE(h->ring_entries);
	end = READ_ONCE(h->queue_offset) +
	      (u64)dev->nr_queues * READ_ONCE(h->queue_stride);
	if (!dev->nr_queues || dev->nr_queues > KBP_SO_MAX_QUEUES ||
	    !kbp_so_entries_valid(dev->entries) ||
	    READ_ONCE(h->queue_offset) < KBP_SO_HEADER_SIZE ||
	    READ_ONCE(h->queue_stride) < kbp_so_queue_bytes(dev->entries) ||
	    end > dev->size) {
		pci_err(dev->pdev, "bad layout: %u queues of %u, offset %u stride %u, %zu bytes\n",
			dev->nr_queues, dev->entries, READ_ONCE(h->queue_offset),
			READ_ONCE(h->queue_stride), dev->size);
		return -EINVAL;
	}
	return 0;
}

static int kbp_so_alloc_queues(struct kbp_so_dev *dev)
{
	struct device *d = &dev->pdev->dev;
	u32 i;

	dev->q = devm_kcalloc(d, dev->nr_queues, sizeof(*dev->q), GFP_KERNEL);
	if (!dev->q)
		return -ENOMEM;
	for (i = 0; i < dev->nr_queues; i++) {
		struct kbp_so_queue *q = &dev->q[i];
		u8 *base = (u8 *)dev->hdr + dev->hdr->queue_offset +
			   (size_t)i * dev->hdr->queue_stride;

		spin_lock_init(&q->lock);
		q->dev = dev;
		q->idx = i;
		q->ctl = (struct kbp_so_queue_ctl *)base;
		q->sq = (struct kbp_so_sqe *)(base + KBP_SO_QCTL_SIZE);
		q->cq = (struct kbp_so_cqe *)(base + KBP_SO_QCTL_SIZE +
					      (size_t)dev->entries * sizeof(*q->sq));
		q->slots = devm_kcalloc(d, dev->entries, sizeof(*q->slots), GFP_KERNEL);
		q->slot_gen = devm_kcalloc(d, dev->entries, sizeof(*q->slot_gen),
					   GFP_KERNEL);
		if (!q->slots || !q->slot_gen)
			return -ENOMEM;
	}
	return 0;
}

/*
 * The reset handshake's first half (docs/design.md, 11.5): once the host
 * acks, it has dropped every socket and parked request of this guest and
 * writes nothing more into its RAM; it serves nothing until ATTACHED.
 * Asks; returns the generation the ack will name.  Any context.
 */
static u32 kbp_so_reset_ask(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	u32 gen = READ_ONCE(h->guest_gen) + 1;

	WRITE_ONCE(h->guest_state, KBP_SO_GUEST_RESET);
	smp_wmb();	/* RESET before the generation the host acts on */
	WRITE_ONCE(h->guest_gen, gen);
	writel(KBP_SO_HOST_PEER << 16, dev->regs + IVSHMEM_REG_DOORBELL);
	return gen;
}

static bool kbp_so_reset_acked(struct kbp_so_dev *dev, u32 gen)
{
	/* acquire: the host's reset of the queues is visible once it acks */
	return smp_load_acquire(&dev->hdr->host_ack_gen) == gen;
}

/* The handshake, waiting (asleep) up to KBP_SO_ATTACH_MS for the ack. */
static int kbp_so_reset_host(struct kbp_so_dev *dev)
{
	u32 gen = kbp_so_reset_ask(dev);
	unsigned long end = jiffies + msecs_to_jiffies(KBP_SO_ATTACH_MS);

	while (!kbp_so_reset_acked(dev, gen)) {
		if (time_after(jiffies, end)) {
			pci_err(dev->pdev, "kbp-sod did not answer the reset\n");
			return -ETIMEDOUT;
		}
		usleep_range(1000, 2000);
	}
	return 0;
}

/*
 * A panic: the next kernel (panic=N's reboot, a crash kernel's kexec) may
 * own this RAM soon, and a parked receive would write into it.  The same
 * handshake, its wait busy and bounded (nothing sleeps here), then ABSENT.
 * No lock is taken: other CPUs are stopped, and one of them may hold any.
 * kbp_so_panic_dev: the attached device, set at probe's end, cleared
 * before removal (kbp_so_panic_forget()).
 */
#define KBP_SO_PANIC_WAIT_MS	500

static struct kbp_so_dev *kbp_so_panic_dev;

static int kbp_so_panic(struct notifier_block *nb, unsigned long event, void *unused)
{
	struct kbp_so_dev *dev = READ_ONCE(kbp_so_panic_dev);
	unsigned int ms;
	u32 gen;

	if (!dev)
		return NOTIFY_DONE;
	gen = kbp_so_reset_ask(dev);
	for (ms = 0; ms < KBP_SO_PANIC_WAIT_MS && !kbp_so_reset_acked(dev, gen); ms++)
		mdelay(1);
	/* release: nothing of ours follows; the host stops serving */
	smp_store_release(&dev->hdr->guest_state, KBP_SO_GUEST_ABSENT);
	writel(KBP_SO_HOST_PEER << 16, dev->regs + IVSHMEM_REG_DOORBELL);
	return NOTIFY_DONE;
}

struct notifier_block kbp_so_panic_nb = {
	.notifier_call = kbp_so_panic,
};

static void kbp_so_panic_forget(struct kbp_so_dev *dev)
{
	WRITE_ONCE(kbp_so_panic_dev, NULL);
	/* a panic on another CPU now runs on with its copy: stops all others */
}

/* The reset handshake, then ATTACHED at this epoch. */
static int kbp_so_attach(struct kbp_so_dev *dev)
{
	struct kbp_so_header *h = dev->hdr;
	int err = kbp_so_reset_host(dev);
	u32 i;

	if (err)
		return err;
	/* need_irq on demand where the host honours it, else always set */
	dev->features = READ_ONCE(h->host_features) &
			(KBP_SO_FEAT_NEED_IRQ | KBP_SO_FEAT_META | KBP_SO_FEAT_QUEUE_OPTS);
	dev->irq_on_demand = dev->features & KBP_SO_FEAT_NEED_IRQ;
	for (i = 0; i < dev->nr_queues; i++) {
		dev->q[i].sq_tail = 0;
		dev->q[i].cq_head = 0;
		dev->q[i].irq_wanted = 0;
		/* before any atomic of ours on it: the guest is not attached yet */
		WRITE_ONCE(dev->q[i].ctl->need_irq, !dev->irq_on_demand);
	}
	dev->epoch = READ_ONCE(h->epoch);
	WRITE_ONCE(h->guest_epoch, dev->epoch);
	WRITE_ONCE(h->guest_features, dev->features);
	/* release: need_irq and guest_epoch before the host starts serving */
	smp_store_release(&h->guest_state, KBP_SO_GUEST_ATTACHED);
	return 0;
}

/*
 * Fails every request in flight with @res and refuses new ones: at removal
 * (@host_dead false, after the host's reset ack: nothing of it writes any
 * more) or because the host is dead (@host_dead: the requests that lent
 * pages make them orphans, their waiters keep them pinned).
 */
static void kbp_so_fail_slots(struct kbp_so_dev *dev, int res, bool host_dead)
{
	unsigned long flags;
	u32 i, s;

	for (i = 0; i < dev->nr_queues; i++) {
		struct kbp_so_queue *q = &dev->q[i];

		spin_lock_irqsave(&q->lock, flags);
		if (host_dead)
			WRITE_ONCE(dev->host_dead, true);
		else
			dev->dead = true;
		for (s = 0; s < dev->entries; s++) {
			struct kbp_so_req *req = q->slots[s];

			if (!req)
				continue;
			req->orphan = host_dead && req->lends;
			req->cqe.res = res;
			kbp_so_unwant_irq(dev, q, req);
			kbp_so_finish(req);
			q->slots[s] = NULL;
		}
		spin_unlock_irqrestore(&q->lock, flags);
	}
}

static void kbp_so_fail_all(struct kbp_so_dev *dev)
{
	kbp_so_fail_slots(dev, -ENETDOWN, false);
}

/*
 * The watchdog (docs/design.md, 11.5), every heartbeat period on an
 * unbound worker (kbp_so_watch_again()): a heartbeat
 * that stood still for host_timeout_ms, or a new epoch (the daemon
 * restarted: its predecessor's sockets and parked requests are gone, and
 * QEMU cannot give us the new one's doorbells), declares the host dead:
 * every waiter returns ECONNRESET, new sockets ENETDOWN.  Pages lent then
 * are orphans until a new epoch proves the old daemon gone (its flock).
 */
static void kbp_so_watch_again(struct kbp_so_dev *dev)
{
	/* unbound: a CPU that an RT task keeps busy does not stall the watchdog */
	queue_delayed_work(system_unbound_wq, &dev->watch,
			   msecs_to_jiffies(KBP_SO_HEARTBEAT_MS));
}

/*
 * The watchdog's: CLOSE the host sockets of kbp_so_zombies that belong to
 * this attach and host; those of a gone device or host are gone with it.
 * Takes kbp_so_rwsem for reading if it can (removal holds it for writing
 * only after it cancelled the watchdog).
 */
static void kbp_so_zombies_close(struct kbp_so_dev *dev)
{
	struct kbp_so_zombie *z, *tmp;
	LIST_HEAD(list);

	if (!atomic_read(&kbp_so_nzombies) || !down_read_trylock(&kbp_so_rwsem))
		return;
	kbp_so_zombies_take(&list);
	list_for_each_entry_safe(z, tmp, &list, node) {
		struct kbp_so_sqe sqe = { .op = KBP_SO_OP_CLOSE, .sock = z->handle };
		struct kbp_so_cqe cqe;
		int err = 0;

		if (z->attach_id == dev->attach_id && !READ_ONCE(dev->host_dead) &&
		    READ_ONCE(dev->hdr->epoch) == dev->epoch)
			err = kbp_so_call(dev, &sqe, &cqe, NULL, KBP_SO_SLOTS_RESERVED);
		if (err != -ETIMEDOUT && err != -EAGAIN)
			kbp_so_zombie_free(z);
	}
	kbp_so_zombies_give_back(&list);
	up_read(&kbp_so_rwsem);
}

static void kbp_so_watch(struct work_struct *work)
{
	struct kbp_so_dev *dev = container_of(to_delayed_work(work), struct kbp_so_dev,
					      watch);
	unsigned long limit = msecs_to_jiffies(READ_ONCE(kbp_so_host_timeout_ms));
	bool new_epoch = READ_ONCE(dev->hdr->epoch) != dev->epoch;
	u64 hb = READ_ONCE(dev->hdr->heartbeat);

	/* first: a late tick (a busy vCPU) must not mistake a live host */
	if (hb != dev->hb) {
		dev->hb = hb;
		dev->hb_at = jiffies;
	}
	if (!dev->host_dead && (new_epoch || time_after(jiffies, dev->hb_at + limit))) {
		kbp_so_fail_slots(dev, -ECONNRESET, true);
		pci_err(dev->pdev, "kbp-sod is dead (%s): its sockets are reset\n",
			new_epoch ? "new epoch" : "no heartbeat");
	}
	/* orphans made after the failure (waiters wake later) are caught too */
	if (dev->host_dead && new_epoch && atomic_read(&kbp_so_orphaned)) {
		unsigned int n = kbp_so_release_orphans();

		pci_info(dev->pdev, "new epoch: released %u orphaned page(s)\n", n);
	}
	kbp_so_zombies_close(dev);
	kbp_so_watch_again(dev);
}

static void kbp_so_free_irqs(struct kbp_so_dev *dev, u32 n)
{
	while (n--) {
		irq_update_affinity_hint(dev->q[n].irq, NULL);
		free_irq(dev->q[n].irq, &dev->q[n]);
	}
	pci_free_irq_vectors(dev->pdev);
}

static int kbp_so_probe(struct pci_dev *pdev, const struct pci_device_id *id)
{
	struct kbp_so_sqe nop = { .op = KBP_SO_OP_NOP };
	struct kbp_so_cqe cqe;
	struct kbp_so_dev *dev;
	int err, nvec;
	u32 i;

	dev = devm_kzalloc(&pdev->dev, sizeof(*dev), GFP_KERNEL);
	if (!dev)
		return -ENOMEM;
	dev->pdev = pdev;
	err = pci_enable_device(pdev);
	if (err)
		return err;
	err = pci_request_regions(pdev, KBUILD_MODNAME);
	if (err)
		goto err_disable;
	dev->regs = pci_iomap(pdev, 0, 0);
	if (!dev->regs) {
		err = -ENOMEM;
		goto err_regions;
	}
	dev->size = pci_resource_len(pdev, 2);
	if (dev->size < KBP_SO_HEADER_SIZE) {
		err = -ENODEV;
		goto err_unmap_regs;
	}
	/* RAM on the host side: cacheable, like any memory shared with a peer */
	dev->hdr = memremap(pci_resource_start(pdev, 2), dev->size, MEMREMAP_WB);
	if (!dev->hdr) {
		err = -ENOMEM;
		goto err_unmap_regs;
	}
	err = kbp_so_check_header(dev);
	if (err)
		goto err_unmap_region;
	err = kbp_so_alloc_queues(dev);
	if (err)
		goto err_unmap_region;
	pci_set_master(pdev);
	nvec = pci_alloc_irq_vectors(pdev, 1, dev->nr_queues, PCI_IRQ_MSIX);
	if (nvec < 0) {
		err = nvec;
		pci_err(pdev, "no MSI-X vectors: %d\n", err);
		goto err_clear_master;
	}
	dev->nr_used = nvec;	/* queues past the vectors stay unused */
	for (i = 0; i < dev->nr_used; i++) {
		dev->q[i].irq = pci_irq_vector(pdev, i);
		err = request_irq(dev->q[i].irq, kbp_so_irq, 0, KBUILD_MODNAME, &dev->q[i]);
		if (err) {
			kbp_so_free_irqs(dev, i);
			goto err_clear_master;
		}
		/*
		 * queue i is CPU i's (kbp_so_this_queue()): its interrupt goes to
		 * that CPU, the one that announces a halt in its need_irq
		 */
		irq_set_affinity_and_hint(dev->q[i].irq,
					  cpumask_of(cpumask_local_spread(i, NUMA_NO_NODE)));
	}
	err = kbp_so_attach(dev);
	if (err)
		goto err_irqs;

	down_write(&kbp_so_rwsem);
	if (kbp_so_cur) {
		up_write(&kbp_so_rwsem);
		pci_err(pdev, "another kbp-sod device is attached already\n");
		err = -EBUSY;
		goto err_detach;
	}
	dev->attach_id = ++kbp_so_attach_ids;
	WRITE_ONCE(kbp_so_cur, dev);
	downgrade_write(&kbp_so_rwsem);
	/* one round trip: the doorbell, the host, the interrupt */
	err = kbp_so_call(dev, &nop, &cqe, NULL, KBP_SO_SLOTS_RESERVED);
	up_read(&kbp_so_rwsem);
	if (err || cqe.res) {
		pci_err(pdev, "NOP round trip failed: %d/%d\n", err, err ? 0 : cqe.res);
		err = err ? err : -EIO;
		goto err_unpublish;
	}
	pci_set_drvdata(pdev, dev);
	dev->hb = READ_ONCE(dev->hdr->heartbeat);
	dev->hb_at = jiffies;
	INIT_DELAYED_WORK(&dev->watch, kbp_so_watch);
	kbp_so_watch_again(dev);
	kbp_so_idle_attach(dev);
	WRITE_ONCE(kbp_so_panic_dev, dev);
	pci_info(pdev, "attached: ivshmem ID %u, epoch %u, %u of %u queue(s) of %u, NOP round trip ok\n",
		 readl(dev->regs + IVSHMEM_REG_IVPOSITION), dev->epoch, dev->nr_used,
		 dev->nr_queues, dev->entries);
	return 0;

err_unpublish:
	kbp_so_fail_all(dev);
	down_write(&kbp_so_rwsem);
	WRITE_ONCE(kbp_so_cur, NULL);
	up_write(&kbp_so_rwsem);
err_detach:
	/* release: nothing more of ours follows; the host stops serving */
	smp_store_release(&dev->hdr->guest_state, KBP_SO_GUEST_ABSENT);
err_irqs:
	kbp_so_free_irqs(dev, dev->nr_used);
err_clear_master:
	pci_clear_master(pdev);
err_unmap_region:
	memunmap(dev->hdr);
err_unmap_regs:
	pci_iounmap(pdev, dev->regs);
err_regions:
	pci_release_regions(pdev);
err_disable:
	pci_disable_device(pdev);
	return err;
}

/*
 * The device goes (rmmod, unbind, shutdown): every waiter wakes with
 * ENETDOWN, then no caller is left inside.  Only a host that acked the
 * reset (it dropped every parked request of ours, design.md 11.5) gets
 * the lent pages back into the allocator; a host that did not, or a dead
 * one (a stopped daemon may resume), may still write them: they stay
 * pinned as orphans for good, said with their count.
 */
static void kbp_so_quiesce(struct kbp_so_dev *dev)
{
	struct pci_dev *pdev = dev->pdev;
	bool acked;
	unsigned int n;

	/* first: no idle vCPU or sweep touches the device after this */
	kbp_so_idle_detach(dev);
	cancel_delayed_work_sync(&dev->watch);	/* host_dead is stable now */
	acked = !dev->host_dead && !kbp_so_reset_host(dev);
	kbp_so_fail_slots(dev, -ENETDOWN, !acked);
	down_write(&kbp_so_rwsem);
	WRITE_ONCE(kbp_so_cur, NULL);
	up_write(&kbp_so_rwsem);
	if (acked) {
		n = kbp_so_release_orphans();
		if (n)
			pci_info(pdev, "released %u orphaned page(s) of a previous kbp-sod\n", n);
	} else if (atomic_read(&kbp_so_orphaned)) {
		pci_warn(pdev, "kbp-sod did not ack the reset: %d page(s) it may still write stay pinned\n",
			 atomic_read(&kbp_so_orphaned));
	}
	/* release: no request of ours is left; the host stops serving */
	smp_store_release(&dev->hdr->guest_state, KBP_SO_GUEST_ABSENT);
	writel(KBP_SO_HOST_PEER << 16, dev->regs + IVSHMEM_REG_DOORBELL);
}

static void kbp_so_teardown(struct pci_dev *pdev, struct kbp_so_dev *dev)
{
	kbp_so_free_irqs(dev, dev->nr_used);
	pci_clear_master(pdev);
	memunmap(dev->hdr);
	pci_iounmap(pdev, dev->regs);
	pci_release_regions(pdev);
	pci_disable_device(pdev);
}

static void kbp_so_remove(struct pci_dev *pdev)
{
	struct kbp_so_dev *dev = pci_get_drvdata(pdev);

	if (!dev)	/* shut down already */
		return;
	kbp_so_panic_forget(dev);
	kbp_so_quiesce(dev);
	kbp_so_teardown(pdev, dev);
	pci_set_drvdata(pdev, NULL);
}

/*
 * Reboot, kexec, power-off: the host drops every parked request before the
 * next kernel owns this RAM (a parked receive would write into it, at the
 * old addresses, whatever reached the port).  The processes that still
 * run see ECONNRESET.
 */
static void kbp_so_pci_shutdown(struct pci_dev *pdev)
{
	kbp_so_remove(pdev);
}

static const struct pci_device_id kbp_so_ids[] = {
	{ PCI_DEVICE(0x1af4, 0x1110) },	/* ivshmem (doorbell) */
	{ }
};
MODULE_DEVICE_TABLE(pci, kbp_so_ids);

struct pci_driver kbp_so_driver = {
	.name		= KBUILD_MODNAME,
	.id_table	= kbp_so_ids,
	.probe		= kbp_so_probe,
	.remove		= kbp_so_remove,
	.shutdown	= kbp_so_pci_shutdown,
};
