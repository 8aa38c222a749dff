// SPDX-License-Identifier: GPL-2.0-only
/*
 * kbp_so page pinning: the user buffer of a send or receive, pinned and
 * described to the host as guest-physical segments for one request;
 * unpinned after its final completion, or kept as an orphan while a host
 * declared dead may still write it.
 */
#define pr_fmt(fmt) KBUILD_MODNAME ": " fmt

#include "kbp_so.h"

/*
 * kbp_so_orphans_lock: the orphan list only (process context: a waiter
 * that learns its host is dead, the watchdog, removal).
 */
static DEFINE_SPINLOCK(kbp_so_orphans_lock);
static LIST_HEAD(kbp_so_orphans);

#ifdef KBP_SO_HAVE_EXTRACT_PAGES
static ssize_t kbp_so_extract(struct iov_iter *it, struct page **pages,
			      size_t max, unsigned int maxpages, size_t *off)
{
	/* user-backed: pins, FOLL_WRITE for a destination iterator */
	return iov_iter_extract_pages(it, &pages, max, maxpages, 0, off);
}

static void kbp_so_release_pages(struct kbp_so_pin *p)
{
	unpin_user_pages_dirty_lock(p->pages, p->nr, p->dirty);
}
#else
/*
 * 6.1 has no iov_iter_extract_pages(), and iov_iter_get_pages2() takes page
 * references, not pins: a fork() during a parked receive would then leave
 * the datagram in the child's copy-on-write copy of the page.  Pin the
 * current segment's pages ourselves, as direct I/O does (FOLL_PIN: fork
 * copies pinned anonymous pages for the child, the parent keeps them).
 */
static ssize_t kbp_so_extract(struct iov_iter *it, struct page **pages,
			      size_t max, unsigned int maxpages, size_t *off)
{
	unsigned int gup = iov_iter_rw(it) == READ ? FOLL_WRITE : 0;
	unsigned long addr;
	size_t len;
	int n, got;

	if (iter_is_ubuf(it)) {
		addr = (unsigned long)it->ubuf + it->iov_offset;
		len = it->count;
	} else if (iter_is_iovec(it)) {
		addr = (unsigned long)it->iov->iov_base + it->iov_offset;
		len = it->iov->iov_len - it->iov_offset;
	} else {
		return -EOPNOTSUPP;
	}
	len = min(len, max);
	if (!len)
		return -EOPNOTSUPP;	/* an empty iovec in the middle: not served */
	*off = offset_in_page(addr);
	n = min_t(size_t, DIV_ROUND_UP(*off + len, PAGE_SIZE), maxpages);
	len = min_t(size_t, len, (size_t)n * PAGE_SIZE - *off);
	got = pin_user_pages_fast(addr & PAGE_MASK, n, gup, pages);
	if (got <= 0)
		return got ? got : -EFAULT;
	if (got < n)
		len = (size_t)got * PAGE_SIZE - *off;
	iov_iter_advance(it, len);
	return len;
}

static void kbp_so_release_pages(struct kbp_so_pin *p)
{
	unpin_user_pages_dirty_lock(p->pages, p->nr, p->dirty);
}
#endif

/*
 * A dead host may still write the pages (a stopped daemon resumes): they
 * move to the orphan list, still pinned, until kbp_so_release_orphans().
 * The record is small; __GFP_NOFAIL because failing here would leave the
 * choice between a leak of the pins and freeing pages a host may write.
 */
static void kbp_so_orphan_pin(struct kbp_so_pin *p)
{
	struct kbp_so_orphan *o = kmalloc(sizeof(*o), GFP_KERNEL | __GFP_NOFAIL);

	o->pin = *p;
	atomic_sub(p->nr, &kbp_so_pinned);
	atomic_add(p->nr, &kbp_so_orphaned);
	spin_lock(&kbp_so_orphans_lock);
	list_add_tail(&o->node, &kbp_so_orphans);
	spin_unlock(&kbp_so_orphans_lock);
	p->nr = 0;
}

/* Only when no host of the old epoch can write any more.  Returns pages. */
unsigned int kbp_so_release_orphans(void)
{
	struct kbp_so_orphan *o, *tmp;
	unsigned int n = 0;
	LIST_HEAD(list);

	spin_lock(&kbp_so_orphans_lock);
	list_splice_init(&kbp_so_orphans, &list);
	spin_unlock(&kbp_so_orphans_lock);
	list_for_each_entry_safe(o, tmp, &list, node) {
		kbp_so_release_pages(&o->pin);
		atomic_sub(o->pin.nr, &kbp_so_orphaned);
		n += o->pin.nr;
		list_del(&o->node);
		kfree(o);
	}
	return n;
}

/* Only after the request's final completion, or when no host can write. */
void kbp_so_unpin(struct kbp_so_pin *p)
{
	if (!p->nr)
		return;
	if (p->orphan) {
		kbp_so_orphan_pin(p);
		return;
	}
	kbp_so_release_pages(p);
	atomic_sub(p->nr, &kbp_so_pinned);
	p->nr = 0;
}

/*
 * Pins @len bytes of the buffer behind @it (advancing it) and describes
 * them in @sqe's segments, physically adjacent pages merged.  On error the
 * caller unpins what was pinned.
 */
int kbp_so_pin_iter(struct iov_iter *it, size_t len, struct kbp_so_pin *p,
		    struct kbp_so_sqe *sqe)
{
	if (!user_backed_iter(it))
		return -EOPNOTSUPP;
	while (len) {
		struct page **pages = &p->pages[p->nr];
		unsigned int n, i;
		size_t off;
		ssize_t got;

		if (p->nr == KBP_SO_MAX_SEGS)
			return -EOPNOTSUPP;	/* needs the bounce page */
		got = kbp_so_extract(it, pages, len, KBP_SO_MAX_SEGS - p->nr, &off);
		if (got <= 0)
			return got ? (int)got : -EFAULT;
		n = DIV_ROUND_UP(off + got, PAGE_SIZE);
		p->nr += n;
		atomic_add(n, &kbp_so_pinned);
		len -= got;
		for (i = 0; i < n; i++) {
			size_t chunk = min_t(size_t, got, PAGE_SIZE - off);
			u64 gpa = page_to_phys(pages[i]) + off;
			struct kbp_so_seg *s = NULL;

			if (sqe->nr_segs)
				s = &sqe->seg[sqe->nr_segs - 1];
			if (s && s->gpa + s->len == gpa) {
				s->len += chunk;
			} else {
				s = &sqe->seg[sqe->nr_segs++];
				s->gpa = gpa;
				s->len = chunk;
			}
			got -= chunk;
			off = 0;
		}
	}
	return 0;
}
