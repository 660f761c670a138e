// SPDX-License-Identifier: BSD-3-Clause
// Ordinary least squares (with an intercept, Eigen's column-pivoting QR) on the rows of a CSV file that a
// train_csv split file (row,set) does not mark `test`, evaluated on the `test` rows: the linear baseline
// that check_train_csv_diabetes.cmake holds train_csv's test error to.
//
//   ols_split DATA.csv TARGET SPLIT.csv [MLP_TEST_MSE MAX_RATIO]
//
// Prints `ols train mse <g> test mse <g>`; with MLP_TEST_MSE and MAX_RATIO also `ratio <r>` (MLP / OLS) and
// exits 1 when the ratio is above MAX_RATIO. Exit 2: bad input.
#include <dpmlp/csv.hpp>

#include <Eigen/Dense>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

int main(int argc, char* argv[]) {
  if (argc != 4 && argc != 6) {
    std::fprintf(stderr, "usage: ols_split DATA.csv TARGET SPLIT.csv [MLP_TEST_MSE MAX_RATIO]\n");
    return 2;
  }
  try {
    const dpmlp::CsvTable t = dpmlp::read_csv(argv[1]);
    const int target = t.require_column(argv[2]);
    // The split: "row,set" lines; set is train, validation or test.
    std::vector<int> is_test(static_cast<std::size_t>(t.rows), -1);
    std::ifstream in(argv[3]);
    std::string line;
    if (!std::getline(in, line) || line != "row,set") throw dpmlp::InputError(std::string(argv[3]) + ": no row,set header");
    while (std::getline(in, line)) {
      const std::size_t comma = line.find(',');
      if (comma == std::string::npos) throw dpmlp::InputError(std::string(argv[3]) + ": bad line '" + line + "'");
      const long long r = std::stoll(line.substr(0, comma));
      if (r < 0 || r >= t.rows) throw dpmlp::InputError(std::string(argv[3]) + ": row out of range: " + line);
      is_test[static_cast<std::size_t>(r)] = line.substr(comma + 1) == "test" ? 1 : 0;
    }
    long long n_fit = 0, n_test = 0;
    for (int v : is_test) {
      if (v < 0) throw dpmlp::InputError(std::string(argv[3]) + ": the split does not cover every row");
      (v ? n_test : n_fit) += 1;
    }
    const int features = t.cols() - 1;
    Eigen::MatrixXd A(n_fit, features + 1), B(n_test, features + 1);
    Eigen::VectorXd a(n_fit), b(n_test);
    long long i = 0, j = 0;
    for (long long r = 0; r < t.rows; ++r) {
      Eigen::MatrixXd& M = is_test[r] ? B : A;
      Eigen::VectorXd& v = is_test[r] ? b : a;
      long long& k = is_test[r] ? j : i;
      int c2 = 0;
      for (int c = 0; c < t.cols(); ++c) {
        if (c != target) M(k, c2++) = t(r, c);
      }
      M(k, features) = 1.0;
      v(k) = t(r, target);
      ++k;
    }
    const Eigen::VectorXd coef = A.colPivHouseholderQr().solve(a);
    const double train_mse = (A * coef - a).squaredNorm() / static_cast<double>(n_fit);
    const double test_mse = (B * coef - b).squaredNorm() / static_cast<double>(n_test);
    std::printf("ols train mse %g test mse %g (%lld fit rows, %lld test rows)\n", train_mse, test_mse, n_fit, n_test);
    if (argc == 6) {
      const double mlp = std::strtod(argv[4], nullptr), most = std::strtod(argv[5], nullptr);
      const double ratio = mlp / test_mse;
      std::printf("ratio %.4f (train_csv test mse %g / OLS test mse %g; at most %g)\n", ratio, mlp, test_mse, most);
      return ratio <= most ? 0 : 1;
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "ols_split: %s\n", e.what());
    return 2;
  }
  return 0;
}
