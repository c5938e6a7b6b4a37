"""The twin's radix (prefix) cache: which prompt tokens a prefill may skip.

SGLang keeps the KV of prefilled prompts in a radix tree over token ids, and a new request
computes only what follows the longest cached prefix (``mem_cache/radix_cache.py``). With
``page_size > 1`` the tree matches whole pages only (``RadixKey.page_aligned``) and
DeepSeek-V4 forces page size 256, so a radix tree whose edges are pages loses nothing: the
twin keys page ``i`` of a prompt by ``hash((key of page i-1, the page's tokens))``, a hash
chain in one dict (no tokens stored; a false hit needs a 64-bit hash collision).

Eviction is LRU over unlocked leaves (SGLang's default ``--radix-eviction-policy lru``);
the pages on the path of a request being prefilled or decoded are locked
(``inc_lock_ref``) and never evicted, and the tree never holds more than its capacity. The
evictable pages sit in one ordered dict, oldest first; a path is released leaf first, so a
parent always comes after its children and the oldest entry is always a leaf: eviction is
O(1) a page, with no heap over the leaves.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence


class _Node:
    __slots__ = ("children", "parent", "ref")

    def __init__(self, parent: int | None) -> None:
        self.parent = parent
        self.ref = 0
        self.children = 0


class PrefixCache:
    """Pages of cached prompt KV, at most ``capacity_tokens`` tokens of them.

    A request's pages are the chain keys of its prompt's whole pages (:meth:`page_keys`);
    it locks the ones it finds (:meth:`acquire`), adds the rest once its prefill is done
    (:meth:`extend`) and unlocks them all when it leaves (:meth:`release`).
    """

    def __init__(self, capacity_tokens: int, page: int) -> None:
        self.page = max(1, int(page))
        self.capacity_pages = max(0, int(capacity_tokens)) // self.page
        self._nodes: dict[int, _Node] = {}
        self._evictable: OrderedDict[int, None] = OrderedDict()
        self.evicted_pages = 0

    # ---- sizes ----
    @property
    def tokens(self) -> int:
        """Tokens held (locked or not): never above the capacity."""
        return len(self._nodes) * self.page

    @property
    def evictable_tokens(self) -> int:
        return len(self._evictable) * self.page

    @property
    def capacity_tokens(self) -> int:
        return self.capacity_pages * self.page

    # ---- keys ----
    def page_keys(self, tokens: Sequence[int] | Sequence[str]) -> list[int]:
        """Chain keys of the whole pages of ``tokens`` (token ids, or the words the twin
        counts as text tokens); a partial last page has none, as in SGLang's paged tree.

        A page of words is hashed as its text joined by spaces (words hold no whitespace,
        so this is exact, and ~1.5x faster than a tuple of 256 strings); a page of ids as a
        tuple. The two never compare equal."""
        p = self.page
        end = len(tokens) // p * p
        keys: list[int] = []
        if end == 0:
            return keys
        h = 0
        if isinstance(tokens[0], str):
            words: Sequence[str] = tokens  # type: ignore[assignment]
            for i in range(0, end, p):
                h = hash((h, " ".join(words[i : i + p])))
                keys.append(h)
        else:
            t = tuple(tokens)
            for i in range(0, end, p):
                h = hash((h, t[i : i + p]))
                keys.append(h)
        return keys

    # ---- lookups ----
    def match(self, keys: Sequence[int], limit: int) -> int:
        """Pages of ``keys[:limit]`` cached, from the first (no locking, no LRU update)."""
        nodes = self._nodes
        n = 0
        for k in keys[: max(0, limit)]:
            if k not in nodes:
                break
            n += 1
        return n

    def acquire(self, keys: Sequence[int], limit: int) -> int:
        """Lock the longest cached run of ``keys[:limit]``; return its length in pages."""
        nodes, evictable = self._nodes, self._evictable
        n = 0
        for k in keys[: max(0, limit)]:
            node = nodes.get(k)
            if node is None:
                break
            if node.ref == 0:
                del evictable[k]
            node.ref += 1
            n += 1
        return n

    def extend(self, keys: Sequence[int], held: int) -> int:
        """Add (and lock) ``keys[held:]`` after the locked ``keys[:held]``, evicting LRU
        unlocked pages to make room; stop at the first page that does not fit. Returns the
        pages now locked."""
        nodes, evictable = self._nodes, self._evictable
        for i in range(held, len(keys)):
            k = keys[i]
            node = nodes.get(k)
            if node is None:
                if len(nodes) >= self.capacity_pages and not self._evict_one():
                    return i
                parent = keys[i - 1] if i else None
                node = nodes[k] = _Node(parent)
                if parent is not None:
                    nodes[parent].children += 1
            elif node.ref == 0:
                del evictable[k]
            node.ref += 1
        return len(keys)

    def release(self, keys: Sequence[int], held: int) -> None:
        """Unlock ``keys[:held]``, leaf first (the LRU order keeps parents after children)."""
        nodes, evictable = self._nodes, self._evictable
        for i in range(held - 1, -1, -1):
            k = keys[i]
            node = nodes[k]
            node.ref -= 1
            if node.ref == 0:
                evictable[k] = None

    def _evict_one(self) -> bool:
        """Drop the least recently used unlocked page (a leaf); False when all are locked."""
        if not self._evictable:
            return False
        k, _ = self._evictable.popitem(last=False)
        node = self._nodes.pop(k)
        if node.parent is not None:
            self._nodes[node.parent].children -= 1
        self.evicted_pages += 1
        return True

    def reset(self) -> bool:
        """Empty the cache (``/flush_cache``); refused (False) while a request holds pages,
        as SGLang flushes only when idle."""
        if len(self._evictable) != len(self._nodes):
            return False
        self._nodes.clear()
        self._evictable.clear()
        return True

    def check(self) -> None:
        """Assert the invariants (tests): capacity, locks, leaves first in LRU order."""
        assert len(self._nodes) <= self.capacity_pages
        seen: set[int] = set()
        for k in self._evictable:
            node = self._nodes[k]
            assert node.ref == 0
            if node.parent is not None:
                assert node.parent not in seen  # a parent after its children
            seen.add(k)
        children: dict[int, int] = {}
        for k, node in self._nodes.items():
            assert (node.ref == 0) == (k in self._evictable)
            if node.parent is not None:
                parent = self._nodes[node.parent]
                assert parent.ref >= node.ref
                children[node.parent] = children.get(node.parent, 0) + 1
        for k, node in self._nodes.items():
            assert node.children == children.get(k, 0)
