"""RAGFlow's queue constants (``common/constants.py`` in RAGFlow v0.26+).

``STANDIN_GROUP`` overrides the consumer group so each test can use a group of its own.
"""

import os

SVR_QUEUE_NAME = "te"
SVR_CONSUMER_GROUP_NAME = os.environ.get("STANDIN_GROUP") or "rag_flow_svr_task_broker"
MAXIMUM_TASK_PAGE_NUMBER = 100000000
