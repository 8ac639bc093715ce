"""SGLang's radix cache: a tree of token sequences, locked while requests use them, evicted
leaf by leaf, least recently used first.

Read from SGLang v0.5.3, python/sglang/srt/mem_cache/radix_cache.py (match_prefix, insert,
_split_node, evict, inc_lock_ref/dec_lock_ref). Tokens are written as runs (unit, start, length):
the tokens `start .. start + length` of a unit (a trace's 512-token block, a prompt nobody shares,
a request's outputs), so a 10,000-token prompt is a few runs, not 10,000 ids.
"""

from __future__ import annotations

import heapq
import itertools

Run = tuple[int, int, int]  # (unit id, first token in the unit, tokens)


def take_runs(runs: tuple[Run, ...], n: int) -> tuple[tuple[Run, ...], tuple[Run, ...]]:
    """(the first n tokens, the rest)."""
    head: list[Run] = []
    for i, (uid, start, length) in enumerate(runs):
        if n >= length:
            head.append((uid, start, length))
            n -= length
            if n == 0:
                return tuple(head), runs[i + 1 :]
        else:
            if n:
                head.append((uid, start, n))
            return tuple(head), ((uid, start + n, length - n), *runs[i + 1 :])
    return tuple(head), ()


def common_tokens(a: tuple[Run, ...], b: tuple[Run, ...]) -> int:
    """Tokens two run sequences agree on from the start (runs may be cut at different places)."""
    ia = ib = 0
    oa = ob = 0  # tokens consumed inside the current runs
    total = 0
    while ia < len(a) and ib < len(b):
        ua, sa, la = a[ia]
        ub, sb, lb = b[ib]
        if ua != ub or sa + oa != sb + ob:
            break
        m = min(la - oa, lb - ob)
        total += m
        oa += m
        ob += m
        if oa == la:
            ia, oa = ia + 1, 0
        if ob == lb:
            ib, ob = ib + 1, 0
    return total


def first_token(runs: tuple[Run, ...]) -> tuple[int, int]:
    return runs[0][0], runs[0][1]


class Node:
    __slots__ = ("children", "key", "length", "lock_ref", "parent", "stamp")

    def __init__(self, key: tuple[Run, ...], length: int, parent: Node | None) -> None:
        self.key = key
        self.length = length
        self.parent = parent
        self.children: dict[tuple[int, int], Node] = {}
        self.lock_ref = 0
        self.stamp = 0


class RadixCache:
    def __init__(self, page_size: int = 1) -> None:
        self.page_size = page_size
        self.root = Node((), 0, None)
        self.root.lock_ref = 1
        self.total_tokens = 0
        self.evictable_tokens = 0
        self.num_nodes = 0
        self._clock = itertools.count(1)
        self._heap: list[tuple[int, int, Node]] = []  # (stamp, tie, leaf) candidates, checked lazily
        self._tie = itertools.count()

    def _touch(self, node: Node) -> None:
        node.stamp = next(self._clock)  # last_access_time
        if not node.children and node.lock_ref == 0 and node is not self.root:
            heapq.heappush(self._heap, (node.stamp, next(self._tie), node))

    def _split(self, child: Node, n: int) -> Node:
        """_split_node: a new node holding the child's first n tokens, above it."""
        parent = child.parent
        assert parent is not None
        head, tail = take_runs(child.key, n)
        new = Node(head, n, parent)
        self.num_nodes += 1
        new.lock_ref = child.lock_ref
        new.stamp = child.stamp
        parent.children[first_token(head)] = new
        child.key, child.length, child.parent = tail, child.length - n, new
        new.children[first_token(tail)] = child
        return new

    def match(self, key: tuple[Run, ...], max_tokens: int) -> tuple[int, Node]:
        """match_prefix: (tokens cached from the start of key, at most max_tokens, floored to the
        page size; the node where the match ends)."""
        page = self.page_size
        limit = max_tokens // page * page
        key, _ = take_runs(key, limit)
        node, matched = self.root, 0
        self._touch(node)
        while key:
            child = node.children.get(first_token(key))
            if child is None:
                break
            n = common_tokens(child.key, key) // page * page
            if n == 0:
                break
            self._touch(child)
            if n < child.length:
                node = self._split(child, n)
                matched += n
                break
            node, matched = child, matched + n
            _, key = take_runs(key, n)
        return matched, node

    def insert(self, key: tuple[Run, ...]) -> tuple[int, Node]:
        """insert: (tokens of key already in the tree, the node holding key's last token). The
        new tokens are the tree's from now on."""
        self._touch(self.root)
        return self._insert_below(self.root, key)

    def extend(self, node: Node, rest: tuple[Run, ...]) -> Node:
        """insert of a key whose tokens up to `node` (locked, so its path is whole) are in the tree already:
        only `rest`, the tokens after them, is walked and added below it. A chunked prefill's next chunk,
        without walking its whole prompt again (linear in the chunks, not quadratic). The nodes above `node`
        keep their access times until the whole key is inserted again (the request's next full insert)."""
        return self._insert_below(node, rest)[1]

    def _insert_below(self, node: Node, key: tuple[Run, ...]) -> tuple[int, Node]:
        present = 0
        while key:
            child = node.children.get(first_token(key))
            if child is None:
                break
            n = common_tokens(child.key, key)
            self._touch(child)
            if n < child.length:
                child = self._split(child, n)
            node, present = child, present + n
            _, key = take_runs(key, n)
        if key:
            length = sum(r[2] for r in key)
            leaf = Node(key, length, node)
            self.num_nodes += 1
            node.children[first_token(key)] = leaf
            self.total_tokens += length
            self.evictable_tokens += length
            self._touch(leaf)
            node = leaf
        return present, node

    def lock(self, node: Node) -> None:
        while node is not self.root:
            if node.lock_ref == 0:
                self.evictable_tokens -= node.length
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def relock(self, old: Node, new: Node) -> None:
        """lock(new) then unlock(old) where `new` is `old` or below it: only the nodes from `new` up to `old`
        (not `old`) change."""
        node = new
        while node is not old:
            if node.lock_ref == 0:
                self.evictable_tokens -= node.length
            node.lock_ref += 1
            assert node.parent is not None
            node = node.parent

    def unlock(self, node: Node) -> None:
        while node is not self.root:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_tokens += node.length
                if not node.children:
                    heapq.heappush(self._heap, (node.stamp, next(self._tie), node))
            assert node.parent is not None
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        """evict: unlocked leaves, least recently used first, until num_tokens are freed (a leaf
        whose parent is left childless makes the parent a candidate). Returns tokens freed."""
        freed = 0
        heap = self._heap
        while freed < num_tokens and heap:
            stamp, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            if parent is None or leaf.children or leaf.lock_ref or stamp != leaf.stamp:
                continue  # gone, no longer a leaf, locked, or touched since this entry
            if parent.children.get(first_token(leaf.key)) is not leaf:
                continue
            del parent.children[first_token(leaf.key)]
            leaf.parent = None
            self.num_nodes -= 1
            freed += leaf.length
            self.total_tokens -= leaf.length
            self.evictable_tokens -= leaf.length
            if not parent.children and parent is not self.root and parent.lock_ref == 0:
                heapq.heappush(heap, (parent.stamp, next(self._tie), parent))
        if len(heap) > 64 + 4 * self.num_nodes:  # drop stale entries
            self._heap = [e for e in heap if e[2].parent is not None and e[0] == e[2].stamp]
            heapq.heapify(self._heap)
        return freed
