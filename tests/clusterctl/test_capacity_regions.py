"""Several regions at once: `capacity offerings --regions` and `capacity prices`, against botocore's Stubber
(it validates every request and response against the real EC2 and Price List service models; moto models
neither Capacity Block offerings nor the Price List). One client per region, as clusterctl makes them; some
regions fail (access denied, an opt-in region the account has not enabled) while the others answer."""

import datetime
import json
import threading

import boto3
import pytest
from botocore.stub import Stubber
from fake_aws import capacity_block_offering

from cluster_aws.errors import EXIT_ACCESS, EXIT_OK, EXIT_USAGE

UTC = datetime.UTC
NOW = datetime.datetime(2026, 11, 21, 9, 0, tzinfo=UTC)
OFFERING_PARAMS = {"InstanceType": "p5.48xlarge", "InstanceCount": 4, "CapacityDurationHours": 168}
OPT_IN_MESSAGE = "AWS was not able to validate the provided access credentials"


@pytest.fixture()
def regions(cli):
    """region -> Stubber of that region's EC2 client, put where clusterctl looks for it ("ec2@region")."""
    stubbers = {}

    def stub(service, region):
        client = boto3.client(service, region_name=region)
        cli.context.clients[f"{service}@{region}"] = client
        stubber = Stubber(client)
        stubber.activate()
        stubbers[(service, region)] = stubber
        return stubber

    yield stub
    for stubber in stubbers.values():
        stubber.assert_no_pending_responses()
        stubber.deactivate()


def all_at_once(stubbers, operation, parties):
    """Each stubbed call waits until `parties` calls are in flight together: sequential calls would time out."""
    barrier = threading.Barrier(parties, timeout=10)
    for stubber in stubbers:
        stubber.client.meta.events.register(f"before-parameter-build.ec2.{operation}", lambda **_: barrier.wait())


def stub_four_regions(regions):
    east, west, spain, mumbai = (regions("ec2", r) for r in ("us-east-1", "us-west-2", "eu-south-2", "ap-south-1"))
    east.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [
        capacity_block_offering("cb-0aaaaaaaaaaaaaaa1", "26880.00", az="us-east-1a"),
        capacity_block_offering("cb-0bbbbbbbbbbbbbbb2", "24192.00", az="us-east-1d", start_day=5),
    ]}, OFFERING_PARAMS)
    west.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": [
        capacity_block_offering("cb-0ccccccccccccccc3", "21504.00", az="us-west-2b"),
    ]}, OFFERING_PARAMS)
    # eu-south-2 (Spain) is an opt-in region: not enabled for this account, EC2 answers AuthFailure (HTTP 401)
    spain.add_client_error("describe_capacity_block_offerings", "AuthFailure", OPT_IN_MESSAGE, 401,
                           expected_params=OFFERING_PARAMS)
    mumbai.add_client_error("describe_capacity_block_offerings", "UnauthorizedOperation",
                            "You are not authorized to perform this operation.", 403,
                            expected_params=OFFERING_PARAMS)
    return [east, west, spain, mumbai]


def test_offerings_from_several_regions_at_once_with_failing_regions_reported(cli, regions):
    stubbers = stub_four_regions(regions)
    all_at_once(stubbers, "DescribeCapacityBlockOfferings", 4)
    result = cli("capacity", "offerings", "--nodes", "4", "--hours", "168",
                 "--regions", "us-east-1,us-west-2,eu-south-2,ap-south-1")
    assert result.code == EXIT_OK  # two regions answered
    rows = [line.split()[:3] for line in result.lines[1:4]]
    assert rows == [  # cheapest first across regions
        ["us-west-2", "cb-0ccccccccccccccc3", "us-west-2b"],
        ["us-east-1", "cb-0bbbbbbbbbbbbbbb2", "us-east-1d"],
        ["us-east-1", "cb-0aaaaaaaaaaaaaaa1", "us-east-1a"],
    ]
    assert "$21,504.00 USD" in result.lines[1] and "$32.00" in result.lines[1]  # 21504 / (4 x 168)
    assert result.lines[-1].startswith("3 offerings of 4 x p5.48xlarge for 168 h in us-east-1, us-west-2 ")
    assert result.err.splitlines() == [
        "clusterctl: warning: eu-south-2: DescribeCapacityBlockOfferings: AuthFailure: " + OPT_IN_MESSAGE
        + " (an opt-in region not enabled for this account answers so; enable it or check with "
        "`aws account list-regions`)",
        "clusterctl: warning: ap-south-1: access denied: DescribeCapacityBlockOfferings: You are not authorized "
        "to perform this operation.",
    ]


def test_offerings_from_several_regions_as_json(cli, regions):
    stub_four_regions(regions)
    result = cli("capacity", "offerings", "--nodes", "4", "--hours", "168", "--json",
                 "--regions", "us-east-1,us-west-2,eu-south-2,ap-south-1")
    report = json.loads(result.out)
    assert [(o["region"], o["offering_id"]) for o in report["offerings"]] == [
        ("us-west-2", "cb-0ccccccccccccccc3"), ("us-east-1", "cb-0bbbbbbbbbbbbbbb2"),
        ("us-east-1", "cb-0aaaaaaaaaaaaaaa1")]
    assert report["offerings"][0]["upfront_fee"] == 21504.0  # the single-region listing's fields
    assert report["regions"] == {"us-east-1": "ok", "us-west-2": "ok", "eu-south-2": "error",
                                 "ap-south-1": "error"}
    assert set(report["errors"]) == {"eu-south-2", "ap-south-1"}


def test_when_every_region_fails_the_exit_code_is_the_first_regions(cli, regions):
    for region in ("ap-south-1", "eu-south-2"):
        regions("ec2", region).add_client_error(
            "describe_capacity_block_offerings", "UnauthorizedOperation", "not authorized", 403,
            expected_params=OFFERING_PARAMS)
    result = cli("capacity", "offerings", "--nodes", "4", "--hours", "168", "--regions", "ap-south-1,eu-south-2")
    assert result.code == EXIT_ACCESS
    assert result.lines == ["0 offerings of 4 x p5.48xlarge for 168 h in no region (cheapest first); buy one in "
                            "its region with: clusterctl --region REGION capacity purchase OFFERING "
                            "--instance-type p5.48xlarge --nodes 4 --hours 168"]
    assert len(result.err.splitlines()) == 2


def test_a_bad_duration_or_region_list_is_one_usage_error_before_any_call(cli, regions):
    result = cli("capacity", "offerings", "--nodes", "4", "--hours", "25", "--regions", "us-east-1,us-west-2")
    assert result.code == EXIT_USAGE and result.err.startswith("clusterctl: error: --hours=25: allowed: ")
    result = cli("capacity", "offerings", "--nodes", "4", "--hours", "24", "--regions", "us-east-1,Mars")
    assert result.code == EXIT_USAGE
    assert result.err == ("clusterctl: error: --regions='us-east-1,Mars': allowed: comma-separated region codes, "
                          "e.g. us-east-1,us-west-2\n")


def test_without_regions_offerings_stay_single_region(cli):
    client = boto3.client("ec2", region_name="us-east-1")
    cli.context.clients["ec2"] = client
    with Stubber(client) as stubber:
        stubber.add_response("describe_capacity_block_offerings", {"CapacityBlockOfferings": []}, OFFERING_PARAMS)
        result = cli("capacity", "offerings", "--nodes", "4", "--hours", "168")
    assert result.code == EXIT_OK and result.out.startswith("no Capacity Block offering for 4 x p5.48xlarge")


# --- prices ----------------------------------------------------------------------------------------------

SPOT_PARAMS = {"InstanceTypes": ["p5.48xlarge"], "ProductDescriptions": ["Linux/UNIX"], "StartTime": NOW,
               "EndTime": NOW}
PRICING_PARAMS = {
    "ServiceCode": "AmazonEC2",
    "Filters": [
        {"Type": "TERM_MATCH", "Field": "instanceType", "Value": "p5.48xlarge"},
        {"Type": "TERM_MATCH", "Field": "operatingSystem", "Value": "Linux"},
        {"Type": "TERM_MATCH", "Field": "tenancy", "Value": "Shared"},
        {"Type": "TERM_MATCH", "Field": "preInstalledSw", "Value": "NA"},
        {"Type": "TERM_MATCH", "Field": "capacitystatus", "Value": "Used"},
        {"Type": "TERM_MATCH", "Field": "licenseModel", "Value": "No License required"},
    ],
}


def spot(az, price, hours_ago):
    return {"AvailabilityZone": az, "InstanceType": "p5.48xlarge", "ProductDescription": "Linux/UNIX",
            "SpotPrice": price, "Timestamp": NOW - datetime.timedelta(hours=hours_ago)}


def price_list_item(region, usd):
    """One GetProducts PriceList entry: a JSON document as text (the Price List's product + terms shape)."""
    return json.dumps({
        "product": {"productFamily": "Compute Instance", "sku": f"SKU{region}",
                    "attributes": {"instanceType": "p5.48xlarge", "regionCode": region, "operatingSystem": "Linux"}},
        "serviceCode": "AmazonEC2",
        "terms": {"OnDemand": {f"SKU{region}.JRTCKXETXF": {"priceDimensions": {
            f"SKU{region}.JRTCKXETXF.6YS6EN2CT7": {"unit": "Hrs", "pricePerUnit": {"USD": usd},
                                                   "description": "p5.48xlarge On Demand Linux"}}}}},
    })


def stub_spot(regions):
    east, west, spain = (regions("ec2", r) for r in ("us-east-1", "us-west-2", "eu-south-2"))
    east.add_response("describe_spot_price_history", {"SpotPriceHistory": [
        spot("us-east-1a", "31.500000", 2), spot("us-east-1a", "30.100000", 30),  # the newer one is in effect
        spot("us-east-1f", "27.250000", 5),
    ]}, SPOT_PARAMS)
    west.add_response("describe_spot_price_history", {"SpotPriceHistory": []}, SPOT_PARAMS)  # no Spot offer
    spain.add_client_error("describe_spot_price_history", "AuthFailure", OPT_IN_MESSAGE, 401,
                           expected_params=SPOT_PARAMS)


def test_prices_spot_per_az_and_on_demand_from_the_price_list(cli, regions):
    cli.now = NOW
    stub_spot(regions)
    regions("pricing", "us-east-1").add_response("get_products", {
        "FormatVersion": "aws_v1",
        "PriceList": [price_list_item("us-east-1", "55.0400000000"), price_list_item("us-west-2", "55.0400000000"),
                      price_list_item("eu-north-1", "58.9900000000")],
    }, PRICING_PARAMS)
    result = cli("capacity", "prices", "--regions", "us-east-1,us-west-2,eu-south-2")
    assert result.code == EXIT_OK
    assert [line.split() for line in result.lines] == [
        ["REGION", "AZ", "SPOT", "$/H", "SPOT", "SINCE", "ON-DEMAND", "$/H", "ON-DEMAND", "SOURCE"],
        ["us-east-1", "us-east-1f", "$27.25", "2026-11-21T04:00:00Z", "$55.04", "Price", "List", "API"],
        ["us-east-1", "us-east-1a", "$31.50", "2026-11-21T07:00:00Z", "$55.04", "Price", "List", "API"],
        ["us-west-2", "-", "no", "Spot", "offer", "-", "$55.04", "Price", "List", "API"],
        # eu-south-2's Price List entry is missing from this answer: no price rather than a guess
        ["eu-south-2", "-", "error", "(see", "stderr)", "-", "-", "Price", "List", "API"],
        ["on-demand:", "no", "on-demand", "Linux", "price", "in", "the", "Price", "List", "for", "this", "region"],
    ]
    assert result.err.startswith("clusterctl: warning: eu-south-2: DescribeSpotPriceHistory: AuthFailure: ")


def test_prices_fall_back_to_the_catalog_labelled_when_the_price_list_is_denied(cli, regions):
    cli.now = NOW
    stub_spot(regions)
    regions("pricing", "us-east-1").add_client_error(
        "get_products", "AccessDeniedException", "User is not authorized to perform: pricing:GetProducts", 400,
        expected_params=PRICING_PARAMS)
    result = cli("capacity", "prices", "--regions", "us-east-1,us-west-2,eu-south-2", "--json")
    assert result.code == EXIT_OK
    report = json.loads(result.out)
    east, west, spain = report["regions"]
    assert east["onDemand"] == {
        "usdPerHour": 55.04, "source": "catalog",
        "note": "catalog (us-east-1 list price): Price List API unavailable: access denied: GetProducts: User is "
                "not authorized to perform: pricing:GetProducts"}
    assert west["onDemand"]["source"] == "catalog"
    assert west["onDemand"]["note"].startswith("catalog (us-east-1 list price; us-west-2's may differ): ")
    assert east["spot"] == [
        {"availabilityZone": "us-east-1f", "usdPerHour": 27.25, "since": "2026-11-21T04:00:00Z"},
        {"availabilityZone": "us-east-1a", "usdPerHour": 31.5, "since": "2026-11-21T07:00:00Z"}]
    assert west["spot"] == [] and west["error"] is None
    assert spain["spot"] is None and spain["error"].startswith("DescribeSpotPriceHistory: AuthFailure: ")


def test_prices_default_to_the_region_of_the_session(cli, regions):
    cli.now = NOW
    regions("ec2", "us-east-1").add_response("describe_spot_price_history", {"SpotPriceHistory": []},
                                             {**SPOT_PARAMS, "InstanceTypes": ["p4d.24xlarge"]})
    regions("pricing", "us-east-1").add_response(
        "get_products", {"FormatVersion": "aws_v1", "PriceList": [price_list_item("us-east-1", "21.9600000000")]},
        {**PRICING_PARAMS, "Filters": [{**PRICING_PARAMS["Filters"][0], "Value": "p4d.24xlarge"},
                                       *PRICING_PARAMS["Filters"][1:]]})
    result = cli("capacity", "prices", "--instance-type", "p4d.24xlarge")
    assert result.code == EXIT_OK
    assert result.lines[1].split() == ["us-east-1", "-", "no", "Spot", "offer", "-", "$21.96", "Price", "List",
                                       "API"]
