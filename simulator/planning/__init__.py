"""What the planner adds on top of the estimators: layers balanced over pools of unequal speed
(``balance.py``) and error bars from a profile's uncertainty (``spread.py``)."""
