"""How the replay engine lays out a class's time arrays: the axis order, the
column compression, rank coordinates, and where a group sits on the nodes.

A class's slice of the mesh has the class axis removed.  Its arrays keep
their axes sorted by size, the largest last: numpy reduces over a short
*leading* axis ~20x faster than over a short trailing one, and group ops
reduce over short axes (tp) most often.  A *column* fixes a coordinate on the
largest axis (dp, usually).  Every family either varies that whole axis or
stays inside a column, so columns nothing sets apart (no perturbation, no
per-rank compute, not the real rank's) have identical times throughout:
class arrays keep one column for all of them.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

import numpy as np
from numpy.typing import NDArray

from prism_debug.cost import Placement
from prism_debug.engine.times import Time
from prism_debug.graph.execution import ExecutionGraph, Mesh, OpSpec

# the elements of an array laid out (times, masks, nodes: whatever the mesh holds)
_Element = TypeVar("_Element", bound=np.generic)


class Layout:
    def __init__(self, graph: ExecutionGraph, compress: bool = True,
                 sample_columns: int | None = None) -> None:
        self.graph = graph
        self.mesh = graph.mesh
        self.class_axis = self.mesh.axis(graph.class_axis) if graph.class_axis else None
        # the class-local mesh axes, in mesh order and in the arrays' order
        self._local = [a for a in range(len(self.mesh.shape)) if a != self.class_axis]
        self.order = sorted(self._local, key=lambda a: (self.mesh.shape[a], a))
        # No compression when point-to-point ops travel along the columns'
        # axis: they would tell columns apart.
        self.columns_axis = self.order[-1] if self.order and compress else None
        if self.columns_axis is not None and any(
                op.is_p2p and self.columns_axis in graph.family_axes(op.family)
                for program in graph.programs for op in program.ops):
            self.columns_axis = None
        self._explicit: list[int] = []  # coordinates kept apart, in array order
        self._picked = np.arange(0)  # array column -> a coordinate it stands for
        self._position = np.arange(0)  # coordinate -> array column
        self._placements: dict[tuple[str, int], Placement] = {}  # (family, p2p peer or 0)
        self._class_shape: tuple[int, ...] | None = None
        # a sampled layout (see the module's docstring): the array columns of the
        # sample, how many columns are not simulated, and the first of them
        self.sample_columns = sample_columns if self.columns_axis is not None else None
        self.sample = slice(0, 0)
        self.unsampled = 0
        self.first_unsampled: int | None = None
        if self.sample_columns is not None:
            if self.sample_columns < 2:
                raise ValueError(f"a sample needs at least 2 columns, got {sample_columns}")
            self.keep_columns_apart([])

    @property
    def sampled(self) -> bool:
        return self.sample_columns is not None

    # -- shapes and orders -------------------------------------------------------------

    def class_index(self, class_id: int) -> tuple[slice | int, ...]:
        """Selects a class's slice of a mesh-shaped array."""
        if self.class_axis is None:
            return ()
        return (slice(None),) * self.class_axis + (class_id,)

    @property
    def local_shape(self) -> tuple[int, ...]:
        """Shape of a class's slice of the mesh, in mesh order (every column)."""
        return tuple(self.mesh.shape[a] for a in self._local)

    @property
    def class_shape(self) -> tuple[int, ...]:
        """Shape of a class's time arrays, in the internal axis order."""
        if self._class_shape is None:  # (asked per op of the real rank)
            shape = [self.mesh.shape[a] for a in self.order]
            if self.columns_axis is not None:
                shape[-1] = len(self._picked)
            self._class_shape = tuple(shape)
        return self._class_shape

    def internal(self, sliced: NDArray[_Element]) -> NDArray[_Element]:
        """A class's slice of a mesh-shaped array, in the internal axis order
        and with its columns compressed."""
        if not sliced.ndim:
            return sliced
        internal = sliced.transpose([self._local.index(a) for a in self.order])
        if self.columns_axis is not None and internal.shape[-1] > 1:
            internal = internal[..., self._picked]
        # contiguous, or every array computed from it keeps the old memory order
        return np.ascontiguousarray(internal)

    @property
    def model_shape(self) -> tuple[int, ...]:
        """The ``shape`` a compute model draws a class's gaps in: mesh order,
        the columns' axis as wide as the columns simulated."""
        shape = list(self.local_shape)
        if self.columns_axis is not None:
            shape[self._local.index(self.columns_axis)] = len(self._picked)
        return tuple(shape)

    def internal_drawn(self, drawn: NDArray[np.float64], leading: int = 0
                       ) -> NDArray[np.float64]:
        """Arrays a compute model drew in :attr:`model_shape` (after
        ``leading`` axes of their own), in the internal axis order."""
        axes = [*range(leading), *(leading + self._local.index(a) for a in self.order)]
        return np.ascontiguousarray(drawn.transpose(axes))

    def external(self, times: Time) -> Time:
        """Internal-order times back in mesh order and every column (for records)."""
        if not isinstance(times, np.ndarray) or not times.ndim:
            return times
        if self.columns_axis is not None and times.shape[-1] > 1:
            times = times[..., self._position]
        return times.transpose([self.order.index(a) for a in self._local])

    def local_axes(self, family: str) -> tuple[int, ...]:
        """The family's axes as axes of a class array (the class axis removed)."""
        return tuple(sorted(self.order.index(a) for a in self.graph.family_axes(family)
                            if a != self.class_axis))

    def spans_classes(self, family: str) -> bool:
        return self.class_axis is not None and self.class_axis in self.graph.family_axes(family)

    # -- columns -------------------------------------------------------------------------

    def keep_apart(self, mask: NDArray[np.bool_]) -> Callable[[Time], Time] | None:
        """Keep the columns of the ranks in ``mask`` (mesh-shaped) apart from
        the untouched ones.  Returns how to re-lay out a time array held from
        before, or None when held arrays stay valid as they are."""
        if self.columns_axis is None:
            return None
        axis = self.columns_axis
        touched = np.flatnonzero(mask.any(axis=tuple(a for a in range(mask.ndim) if a != axis)))
        return self.keep_columns_apart(touched.tolist())

    def keep_columns_apart(self, columns: Iterable[int]) -> Callable[[Time], Time] | None:
        """:meth:`keep_apart` for coordinates on the columns' axis."""
        if self.columns_axis is None:
            return None
        new = sorted(set(self._explicit) | set(columns))
        if new == self._explicit and len(self._picked):
            return None
        size = self.mesh.shape[self.columns_axis]
        if self.sample_columns is not None:
            return self._sample_apart(new, size)
        kept = set(new)
        # The untouched columns share the column of the first of them.  Array
        # columns stay in coordinate order, so argmax breaks ties (who arrived
        # last) as it would over every column.
        clean = next((c for c in range(size) if c not in kept), None)
        picked = np.array(sorted(new + ([clean] if clean is not None else [])), dtype=np.int64)
        position = np.searchsorted(picked, np.arange(size))
        if clean is not None:
            untouched = np.ones(size, dtype=bool)
            untouched[new] = False
            position[untouched] = int(np.searchsorted(picked, clean))
        old_width = len(self._picked)
        take = self._position[picked] if old_width else None
        self._explicit, self._picked, self._position = new, picked, position
        self._class_shape = None
        # (arrays one column wide broadcast: the value holds for every column)
        if take is None or old_width <= 1:
            return None
        return lambda times: times[..., take] if isinstance(times, np.ndarray) and times.ndim \
            and times.shape[-1] == old_width else times

    def _sample_apart(self, explicit: list[int], size: int) -> Callable[[Time], Time] | None:
        """:meth:`keep_columns_apart` for a sampled layout: the first
        ``sample_columns`` columns not kept apart are the sample."""
        others = np.setdiff1d(np.arange(size), np.array(explicit, dtype=np.int64))
        sample, rest = others[:self.sample_columns], others[self.sample_columns:]
        if len(rest):  # the sample first, a view; the unsampled columns read it in turn
            picked = np.concatenate([sample, np.array(explicit, dtype=np.int64)])
        else:  # every column simulated, in coordinate order: exact
            picked = np.sort(np.concatenate([sample, explicit]).astype(np.int64))
        position = np.empty(size, dtype=np.int64)
        position[picked] = np.arange(len(picked))
        position[rest] = np.arange(len(rest)) % max(len(sample), 1)
        old_width = len(self._picked)
        take = self._position[picked] if old_width else None
        self._explicit, self._picked, self._position = explicit, picked, position
        self.sample = slice(0, len(sample) if len(rest) else 0)
        self.unsampled = len(rest)
        self.first_unsampled = int(rest[0]) if len(rest) else None
        self._class_shape = None
        if take is None:
            return None
        return lambda times: times[..., take] if isinstance(times, np.ndarray) and times.ndim \
            and times.shape[-1] == old_width else times

    def unsampled_rank(self, class_id: int, internal_coords: Sequence[int],
                       base_rank: int) -> int:
        """The rank named for the unsampled columns (the first of them) at
        ``internal_coords``' place off the columns' axis."""
        assert self.columns_axis is not None and self.first_unsampled is not None, \
            "only a sampled layout leaves columns unsimulated"
        rank = self.rank_of(class_id, internal_coords, base_rank)
        coords = list(self.mesh.coordinates(rank))
        coords[self.columns_axis] = self.first_unsampled
        return self.mesh.rank(coords)

    def columns_to_part(self, local: NDArray[np.float64]) -> list[int]:
        """The columns to keep apart before ``local`` (a class's slice, mesh
        order, along the columns' axis every column or one) can be compressed:
        of those the shared column stands for, all but the largest set with
        equal values in ``local`` (which the shared column goes on standing for)."""
        if self.columns_axis is None:
            return []
        axis = self._local.index(self.columns_axis)
        size = local.shape[axis]
        explicit = set(self._explicit)
        shared = [c for c in range(size) if c not in explicit]
        if size == 1 or len(shared) < 2:
            return []
        columns = np.moveaxis(local, axis, 0).reshape(size, -1)[shared]
        _, group, count = np.unique(columns, axis=0, return_inverse=True, return_counts=True)
        largest = int(np.argmax(count))
        return [c for c, g in zip(shared, group.ravel(), strict=True) if g != largest]

    # -- ranks -------------------------------------------------------------------------------

    def internal_coordinates(self, rank: int) -> tuple[int, ...]:
        """``rank``'s element of its class's arrays."""
        coords = self.mesh.coordinates(rank)
        internal = [coords[a] for a in self.order]
        if self.columns_axis is not None:
            internal[-1] = int(self._position[internal[-1]])
        return tuple(internal)

    def rank_of(self, class_id: int, internal_coords: Sequence[int], base_rank: int) -> int:
        """The rank of an element of a class's arrays (mesh coordinates the
        arrays do not have are ``base_rank``'s)."""
        coords = list(self.mesh.coordinates(base_rank))
        for axis, value in zip(self.order, internal_coords, strict=True):
            coords[axis] = value
        if self.columns_axis is not None:
            coords[self.columns_axis] = int(self._picked[coords[self.columns_axis]])
        if self.class_axis is not None:
            coords[self.class_axis] = class_id
        return self.mesh.rank(coords)

    def local_coordinates(self, rank: int) -> tuple[int, ...]:
        """``rank``'s coordinates in its class's slice of the mesh (mesh order)."""
        coords = list(self.mesh.coordinates(rank))
        if self.class_axis is not None:
            del coords[self.class_axis]
        return tuple(coords)

    def mask(self, ranks: Iterable[int]) -> NDArray[np.bool_]:
        """The mesh-shaped mask of ``ranks``."""
        mask = np.zeros(self.mesh.world_size, dtype=bool)
        mask[np.asarray(list(ranks), dtype=np.int64)] = True
        return mask.reshape(self.mesh.shape)

    # -- nodes ---------------------------------------------------------------------------------

    def nodes(self) -> NDArray[np.int_]:
        """Each rank's node, mesh-shaped."""
        return np.arange(self.mesh.world_size).reshape(self.mesh.shape) // self.graph.gpus_per_node

    def placement(self, op: OpSpec) -> Placement:
        """Where the ranks of one of the op's groups sit (the cost model's input)."""
        key = (op.family, op.peer if op.is_p2p else 0)
        placement = self._placements.get(key)
        if placement is None:
            placement = self._placements[key] = _placement(
                self.mesh, self.graph.family_axes(op.family), self.graph.gpus_per_node,
                op.peer if op.is_p2p else None)
        return placement


@functools.lru_cache(maxsize=256)
def _placement(mesh: Mesh, axes: tuple[int, ...], gpus_per_node: int,
               peer: int | None) -> Placement:
    """Kept across engines: a group of 65,536 ranks takes 0.35 s to place, and
    predict builds an engine per sample of one graph."""
    if peer is not None:
        return Placement.pair(0, mesh.strides[axes[0]] * abs(peer), gpus_per_node)
    return Placement.of(mesh.group_ranks(axes, 0), gpus_per_node)
