// Tests of the accountant interface: validation, merging of the ledger, the
// factory, and JSON serialisation (a resumed run continues the same ledger).
#include <doctest/doctest.h>

#include <cmath>
#include <limits>
#include <memory>
#include <stdexcept>
#include <string>

#include <nlohmann/json.hpp>

#include "privacy/accountant.hpp"
#include "privacy/gdp.hpp"
#include "privacy/rdp.hpp"
#include "privacy/shuffle.hpp"
#include "privacy/wor.hpp"

using namespace dpgrad::privacy;

namespace {

AccountantOptions shuffle_options() {
  AccountantOptions o;
  o.dataset_size = 1000;
  o.batch_size = 10;
  o.epoch_fraction = 0.5;
  return o;
}

// A ledger every accountant accepts (shuffle needs q = b/n = 0.01).
void fill(Accountant& a) {
  a.step(0.01, 1.0, 120);
  a.step(0.01, 1.3, 40);
  a.step(0.01, 1.3, 10);  // merged into the previous entry
  a.step(0.01, 0.9, 7);
}

}  // namespace

TEST_CASE("neighbouring relations print as the docs name them") {
  CHECK(to_string(Neighbouring::add_remove) == "add/remove-one");
  CHECK(to_string(Neighbouring::replace_one) == "replace-one");
  CHECK(make_accountant("rdp")->neighbouring() == Neighbouring::add_remove);
  CHECK(make_accountant("gdp")->neighbouring() == Neighbouring::add_remove);
  CHECK(make_accountant("wor")->neighbouring() == Neighbouring::replace_one);
  CHECK(make_accountant("shuffle", shuffle_options())->neighbouring() == Neighbouring::replace_one);
}

TEST_CASE("step() merges consecutive identical entries only") {
  RdpAccountant a;
  fill(a);
  REQUIRE(a.ledger().size() == 3);
  CHECK(a.ledger()[0].count == 120);
  CHECK(a.ledger()[1].count == 50);
  CHECK(a.ledger()[1].noise_multiplier == 1.3);
  CHECK(a.ledger()[2].count == 7);
  CHECK(a.total_steps() == 177);
  // Merging does not change the answer: one step at a time gives the same epsilon.
  RdpAccountant b;
  for (int i = 0; i < 120; ++i) b.step(0.01, 1.0);
  for (int i = 0; i < 50; ++i) b.step(0.01, 1.3);
  for (int i = 0; i < 7; ++i) b.step(0.01, 0.9);
  CHECK(b.ledger().size() == 3);
  CHECK(b.epsilon(1e-5) == a.epsilon(1e-5));
}

TEST_CASE("base validation names the bad value") {
  GdpAccountant a;
  try {
    a.step(1.5, 1.0);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("1.5") != std::string::npos);
  }
  try {
    a.step(0.5, 0.0);
    FAIL("no exception");
  } catch (const std::invalid_argument& e) {
    CHECK(std::string(e.what()).find("infinite") != std::string::npos);
  }
  CHECK_THROWS_AS(a.step(std::nan(""), 1.0), std::invalid_argument);
  CHECK_THROWS_AS(a.step(0.5, std::nan("")), std::invalid_argument);
  CHECK_THROWS_AS(a.step(0.5, std::numeric_limits<double>::infinity()), std::invalid_argument);
  CHECK_THROWS_AS(a.step(0.5, 1.0, -3), std::invalid_argument);
  CHECK_THROWS_AS(a.step(0.5, 1.0, 1, -1), std::invalid_argument);
  CHECK_THROWS_AS(a.step(0.5, 1.0, 1, 8), std::invalid_argument);  // no JL support
  CHECK(a.ledger().empty());
  a.step(0.5, 1.0, std::numeric_limits<long>::max());
  CHECK_THROWS_AS(a.step(0.5, 1.0, 1), std::invalid_argument);  // count would overflow
}

TEST_CASE("factory builds every accountant by name and refuses unknown ones") {
  for (const std::string name : {"rdp", "gdp", "wor"}) {
    auto a = make_accountant(name);
    CHECK(a->name() == name);
  }
  CHECK(make_accountant("shuffle", shuffle_options())->name() == "shuffle");
  CHECK_THROWS_AS(make_accountant("moments"), std::invalid_argument);
  CHECK_THROWS_AS(make_accountant("shuffle"), std::invalid_argument);  // needs n, b, f
  AccountantOptions frac;
  frac.orders = {2.5, 3.0};
  CHECK_NOTHROW(make_accountant("rdp", frac));
  CHECK_THROWS_AS(make_accountant("wor", frac), std::invalid_argument);  // integer orders only
  AccountantOptions ints;
  ints.orders = {2.0, 8.0};
  auto w = make_accountant("wor", ints);
  CHECK(dynamic_cast<WorAccountant&>(*w).orders() == std::vector<double>{2.0, 8.0});
}

TEST_CASE("JSON round trips: same settings, same ledger, same epsilon") {
  AccountantOptions opts = shuffle_options();
  for (const std::string name : {"rdp", "gdp", "wor", "shuffle"}) {
    CAPTURE(name);
    auto a = make_accountant(name, opts);
    fill(*a);
    const nlohmann::json j = a->to_json();
    CHECK(j.at("accountant") == name);
    CHECK(j.at("neighbouring") == to_string(a->neighbouring()));
    // Through text, as a checkpoint file would store it.
    auto b = accountant_from_json(nlohmann::json::parse(j.dump()));
    CHECK(b->name() == name);
    REQUIRE(b->ledger().size() == a->ledger().size());
    for (std::size_t i = 0; i < a->ledger().size(); ++i) {
      CHECK(b->ledger()[i].sampling_rate == a->ledger()[i].sampling_rate);
      CHECK(b->ledger()[i].noise_multiplier == a->ledger()[i].noise_multiplier);
      CHECK(b->ledger()[i].count == a->ledger()[i].count);
    }
    CHECK(b->epsilon(1e-5) == a->epsilon(1e-5));
    CHECK(b->to_json() == j);
    // A resumed run continues the ledger: resume + more steps == uninterrupted run.
    auto c = a->clone();
    c->step(0.01, 0.9, 5);
    b->step(0.01, 0.9, 5);
    CHECK(b->ledger().size() == a->ledger().size());  // merged into the last entry
    CHECK(b->epsilon(1e-5) == c->epsilon(1e-5));
    CHECK(b->epsilon(1e-5) > a->epsilon(1e-5));
  }
  // Settings survive: user orders and the shuffle's n, b, f.
  RdpAccountant r({1.5, 7.0});
  auto r2 = accountant_from_json(r.to_json());
  CHECK(dynamic_cast<RdpAccountant&>(*r2).orders() == std::vector<double>{1.5, 7.0});
  ShuffleAccountant s(5000, 50, 0.25);
  auto s2 = accountant_from_json(s.to_json());
  auto& s3 = dynamic_cast<ShuffleAccountant&>(*s2);
  CHECK(s3.dataset_size() == 5000);
  CHECK(s3.batch_size() == 50);
  CHECK(s3.epoch_fraction() == 0.25);
  // GDP says it is an approximation, in its JSON too.
  CHECK(GdpAccountant().to_json().contains("approximation"));
}

TEST_CASE("malformed JSON is refused with invalid_argument") {
  CHECK_THROWS_AS(accountant_from_json(nlohmann::json::array()), std::invalid_argument);
  CHECK_THROWS_AS(accountant_from_json({{"ledger", nlohmann::json::array()}}), std::invalid_argument);
  CHECK_THROWS_AS(accountant_from_json({{"accountant", "nope"}}), std::invalid_argument);
  nlohmann::json j = RdpAccountant().to_json();
  j["ledger"] = {{{"sampling_rate", 0.1}}};  // no noise multiplier
  CHECK_THROWS_AS(accountant_from_json(j), std::invalid_argument);
  j["ledger"] = {{{"sampling_rate", 2.0}, {"noise_multiplier", 1.0}, {"count", 3}}};  // bad q
  CHECK_THROWS_AS(accountant_from_json(j), std::invalid_argument);
  j["ledger"] = {{{"sampling_rate", "x"}, {"noise_multiplier", 1.0}}};  // wrong type
  CHECK_THROWS_AS(accountant_from_json(j), std::invalid_argument);
  j = RdpAccountant().to_json();
  j["neighbouring"] = "replace-one";  // does not match rdp
  CHECK_THROWS_AS(accountant_from_json(j), std::invalid_argument);
  j = ShuffleAccountant(100, 10, 0.5).to_json();
  j["epoch_fraction"] = 1.0;
  CHECK_THROWS_AS(accountant_from_json(j), std::invalid_argument);
}

TEST_CASE("format_epsilon rounds upwards, never below the computed value") {
  using dpgrad::privacy::format_epsilon;
  CHECK(format_epsilon(1.13532) == "1.1354");  // plain rounding would print 1.1353 < 1.13532
  CHECK(format_epsilon(2.59707951) == "2.5971");
  CHECK(format_epsilon(3.0) == "3.0000");
  CHECK(format_epsilon(0.00001) == "0.0001");
  CHECK(format_epsilon(std::numeric_limits<double>::infinity()) == "inf");
  for (double e : {0.1, 0.30000000000000004, 1.0 / 3.0, 12.34565, 239.25030862})
    CHECK(std::stod(format_epsilon(e)) >= e);
}
