export const PACKAGE_NAME = "@tapwire/harness";
