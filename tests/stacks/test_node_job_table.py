"""The nodes check each job start against this cluster's job table (issue 42): the node config the stack renders
names the table, and the nodes' role may read one item of it and nothing else of it
(node_bootstrap/jobs/job_table.py)."""

from __future__ import annotations

import json
import re


def test_the_nodes_check_each_start_against_this_clusters_job_table(synth):
    stack = synth("default-p5-on-demand")
    (table_id,) = stack.resources("AWS::DynamoDB::Table")
    (lt,) = stack.resources("AWS::EC2::LaunchTemplate").values()
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    # the user data is text joined around CloudFormation values: the table's name follows the config's key
    at = parts.index({"Ref": table_id})
    assert re.search(r'"jobTableName": "$', parts[at - 1]), parts[at - 1][-200:]
    table_statements = [s for k, r in stack.resources("AWS::IAM::Policy").items()
                        for s in r["Properties"]["PolicyDocument"]["Statement"]
                        if k.startswith("NodesRole") and "dynamodb:" in json.dumps(s["Action"])]
    assert table_statements == [{"Sid": "JobTableGetItem", "Action": "dynamodb:GetItem", "Effect": "Allow",
                                 "Resource": {"Fn::GetAtt": [table_id, "Arn"]}}]
