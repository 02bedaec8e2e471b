"""Several fitted HistGradientBoosting regressors flattened into numpy arrays.

scikit-learn's `predict` validates its input and dispatches to OpenMP on every call:
about 0.1-0.3 ms per model for a single row, too much for the admission path. The
fitted trees are plain arrays, so all models' trees are evaluated here together, one
tree level per numpy step. The result is pickled without any scikit-learn object:
loading a model needs only numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Forest:
    """The trees of `n_models` boosted regressors, concatenated."""

    feature: np.ndarray  # per node; 0 on leaves
    threshold: np.ndarray  # go left when x[feature] <= threshold (NaN: see missing_left)
    missing_left: np.ndarray
    left: np.ndarray  # absolute node index; a leaf points to itself
    right: np.ndarray
    value: np.ndarray  # leaf value, 0 on split nodes
    roots: np.ndarray  # root node of each tree
    tree_model: np.ndarray  # which model each tree belongs to
    baselines: np.ndarray  # per model
    depth: int  # levels to walk

    @property
    def n_models(self) -> int:
        return len(self.baselines)

    def predict(self, x: np.ndarray) -> np.ndarray:
        """Raw outputs, shape (n_models,) for one row or (n_rows, n_models)."""
        rows = np.atleast_2d(np.asarray(x, dtype=np.float64))
        idx = np.broadcast_to(self.roots, (len(rows), len(self.roots))).copy()
        row_of = np.arange(len(rows))[:, None]
        for _ in range(self.depth):
            values = rows[row_of, self.feature[idx]]
            go_left = np.where(np.isnan(values), self.missing_left[idx],
                               values <= self.threshold[idx])
            idx = np.where(go_left, self.left[idx], self.right[idx])
        leaves = self.value[idx]
        out = np.zeros((len(rows), self.n_models))
        for model in range(self.n_models):
            out[:, model] = leaves[:, self.tree_model == model].sum(axis=1)
        out += self.baselines
        return out[0] if np.ndim(x) == 1 else out


def compile_forest(estimators) -> Forest:
    """Flatten fitted single-output `HistGradientBoostingRegressor`s (numeric
    features only)."""
    parts = {k: [] for k in ("feature", "threshold", "missing_left", "left", "right", "value")}
    roots, tree_model, baselines, depth, offset = [], [], [], 0, 0
    for model, est in enumerate(estimators):
        baselines.append(float(np.ravel(est._baseline_prediction)[0]))
        for (tree,) in est._predictors:
            nodes = tree.nodes
            if nodes["is_categorical"].any():
                raise ValueError("categorical splits are not supported")
            _append_tree(parts, nodes, offset)
            roots.append(offset)
            tree_model.append(model)
            depth = max(depth, int(nodes["depth"].max()))
            offset += len(nodes)
    arrays = {k: np.concatenate(v) for k, v in parts.items()}
    return Forest(**arrays, roots=np.array(roots), tree_model=np.array(tree_model),
                  baselines=np.array(baselines), depth=depth)


def _append_tree(parts: dict, nodes: np.ndarray, offset: int) -> None:
    leaf = nodes["is_leaf"].astype(bool)
    own = np.arange(len(nodes)) + offset
    parts["feature"].append(np.where(leaf, 0, nodes["feature_idx"]).astype(np.int64))
    parts["threshold"].append(nodes["num_threshold"].astype(np.float64))
    parts["missing_left"].append(nodes["missing_go_to_left"].astype(bool))
    parts["left"].append(np.where(leaf, own, nodes["left"].astype(np.int64) + offset))
    parts["right"].append(np.where(leaf, own, nodes["right"].astype(np.int64) + offset))
    parts["value"].append(np.where(leaf, nodes["value"], 0.0))
