"""`clusterctl cost --region` prices at that region's on-demand price from the AWS Price List (Stubber: the
Price List Query API in us-east-1), or says that the catalog's us-east-1 price stands in; it was ignored."""

import json

import boto3
import pytest
from botocore.stub import Stubber

from cluster_aws.errors import EXIT_FAILED, EXIT_OK

PRICING_PARAMS = {
    "ServiceCode": "AmazonEC2",
    "Filters": [{"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in (
        ("instanceType", "p5.48xlarge"), ("operatingSystem", "Linux"), ("tenancy", "Shared"),
        ("preInstalledSw", "NA"), ("capacitystatus", "Used"), ("licenseModel", "No License required"))],
}


def price_list_item(region, usd):
    """One GetProducts PriceList entry: a JSON document as text."""
    return json.dumps({
        "product": {"sku": f"SKU{region}", "attributes": {"instanceType": "p5.48xlarge", "regionCode": region}},
        "terms": {"OnDemand": {f"SKU{region}.T": {"priceDimensions": {
            f"SKU{region}.T.D": {"unit": "Hrs", "pricePerUnit": {"USD": usd}}}}}},
    })


@pytest.fixture()
def price_list(cli):
    client = boto3.client("pricing", region_name="us-east-1")
    cli.context.clients["pricing@us-east-1"] = client  # where clusterctl.capacity.regions looks for it
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


def test_cost_in_another_region_uses_its_price(cli, price_list):
    price_list.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        price_list_item("us-east-1", "55.0400000000"), price_list_item("eu-north-1", "58.9900000000")]},
        PRICING_PARAMS)
    result = cli("--region", "eu-north-1", "cost", "--nodes", "4", "--hours", "10")
    assert result.code == EXIT_OK, result.err
    # 4 x $58.99 x 10 h, not the catalog's $55.04
    assert result.lines == [
        "plan: 4 x p5.48xlarge for 10.00 h = $2,359.60 ($235.96/h, 320 GPU-hours)",
        "estimate at eu-north-1's on-demand price from the AWS Price List, $58.99 per instance-hour (Linux); "
        "Capacity Blocks are priced by their upfront fee",
    ]


def test_cost_in_another_region_says_when_the_catalog_stands_in(cli, price_list):
    price_list.add_client_error("get_products", "AccessDeniedException", "not authorized", 400,
                                expected_params=PRICING_PARAMS)
    result = cli("--region", "eu-north-1", "--json", "cost", "--nodes", "1", "--hours", "1")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["usdPerInstanceHour"] == 55.04
    assert report["priceSource"].startswith("$55.04 per instance-hour, the catalog (us-east-1 list price; "
                                            "eu-north-1's may differ): Price List API unavailable: ")


def test_cost_where_the_price_list_has_no_price_is_one_line(cli, price_list):
    price_list.add_response("get_products", {"FormatVersion": "aws_v1", "PriceList": [
        price_list_item("us-east-1", "55.0400000000")]}, PRICING_PARAMS)
    result = cli("--region", "eu-north-1", "cost", "--nodes", "1", "--hours", "1")
    assert (result.code, result.out) == (EXIT_FAILED, "")
    assert result.err == ("clusterctl: error: --region=eu-north-1: no on-demand Linux price in the Price List for "
                          "this region (p5.48xlarge)\n")


def test_cost_without_region_asks_no_price_list(cli, price_list):
    # the Stubber refuses any call it was not told of: us-east-1 (or no --region) is the catalog's own region
    assert "$55.04 per instance-hour (us-east-1 Linux)" in cli("cost", "--nodes", "1", "--hours", "1").out
    assert cli("--region", "us-east-1", "cost", "--nodes", "1", "--hours", "1").code == EXIT_OK
