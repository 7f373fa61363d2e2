"""The closed-form (analytic) estimator: a step priced from the cost model by formula, a peer of
the discrete-event engine (neither imports the other)."""
